"""LearnerClient: submits rollout batches to an asympo-learner.

    client = LearnerClient("learner:50051", source="vllm-0")
    print(client.status().limits)
    result = client.submit([group(prompt_tokens, [(tokens, reward), ...]), ...])

Every batch gets a batch_id ("<source>/<session>/<n>") unless one is given,
so that a retry after a lost reply is acknowledged by the learner as a
duplicate and trained once (docs/protocol.md, "Exactly-once"). Every answer
is read with the project's one Submit retry policy (docs/protocol.md,
"Retries"; the same table as the C++ tools' common/submit_retry.h):
retry, with the same id, after the learner's asympo-retry-after-ms hint or
a jittered exponential backoff, until retry_deadline seconds have passed;
drop_batch raises InvalidBatchError; fatal raises RefusedError. Batches are
validated before sending with the learner's own rules and messages.

Policy versions (docs/protocol.md, "Policy lag"): each response may carry
the versions of the weights that sampled its first and last token
(response(..., first_policy_version=, last_policy_version=)); a group, a
batch or a submit given a policy_version stamps it on every response that
carries none, and a client given its WeightSubscriber (weights=) stamps the
version the subscriber last reported as loaded:

    client = LearnerClient("learner:50051", source="vllm-0", weights=sub)
    client.submit(groups)                      # sampled with sub.version
    client.submit(groups, policy_version=17)   # or say which

The learner measures the lag from them and, with --max_policy_lag, refuses
a batch whose group is too old (FAILED_PRECONDITION: InvalidBatchError, the
batch dropped; sample again with newer weights)."""
import collections
import os
import random
import threading
import time

import grpc

from . import validation
from ._stubs import learner_pb2, learner_pb2_grpc, rollout_pb2
from .errors import InvalidBatchError, LearnerBusyError, LearnerUnavailableError, RefusedError

RETRY_AFTER_KEY = "asympo-retry-after-ms"
ACCEPTED_BATCHES_KEY = "asympo-accepted-batches"

# The one Submit retry policy, docs/protocol.md "Retries" (the C++ tools:
# common/submit_retry.h, DecideSubmit). The decisions:
#   retry       send the same batch, same batch_id, again after the hint or
#               the backoff
#   drop_batch  final for this batch (InvalidBatchError): no retry can pass
#               it; the caller drops it and goes on
#   fatal       a configuration error (RefusedError): credentials, roles, an
#               address that serves no learner of this protocol
ACCEPTED, RETRY, DROP_BATCH, FATAL = "accepted", "retry", "drop_batch", "fatal"
_C = grpc.StatusCode
SUBMIT_POLICY = {
    _C.OK: ACCEPTED,
    # The outcome is unknown: the same batch again, same id.
    _C.CANCELLED: RETRY, _C.UNKNOWN: RETRY, _C.DEADLINE_EXCEEDED: RETRY, _C.ABORTED: RETRY,
    _C.INTERNAL: RETRY, _C.UNAVAILABLE: RETRY,
    # With asympo-retry-after-ms: RETRY (decide_submit); without it: gRPC
    # refused a message over its size limit.
    _C.RESOURCE_EXHAUSTED: DROP_BATCH,
    # The batch breaks a rule, or the learner's state does not admit it.
    _C.INVALID_ARGUMENT: DROP_BATCH, _C.FAILED_PRECONDITION: DROP_BATCH,
    _C.OUT_OF_RANGE: DROP_BATCH,
    # Credentials and roles, or no learner of this protocol at the address.
    _C.UNAUTHENTICATED: FATAL, _C.PERMISSION_DENIED: FATAL, _C.NOT_FOUND: FATAL,
    _C.ALREADY_EXISTS: FATAL, _C.UNIMPLEMENTED: FATAL, _C.DATA_LOSS: FATAL,
}


def decide_submit(code, has_retry_hint):
    """The decision for a finished Submit or SubmitStream with status `code`
    (a grpc.StatusCode); has_retry_hint: its trailing metadata carried
    asympo-retry-after-ms."""
    if code == _C.RESOURCE_EXHAUSTED and has_retry_hint:
        return RETRY
    return SUBMIT_POLICY.get(code, FATAL)


def decide_get_status(code, has_retry_hint):
    """The same for GetStatus, which has no batch to drop."""
    decision = decide_submit(code, has_retry_hint)
    return FATAL if decision == DROP_BATCH else decision


def retry_hint(error):
    """The learner's hint of a RESOURCE_EXHAUSTED refusal, in seconds (1 when
    unreadable or negative, at most 60), or None without one."""
    if error.code() != _C.RESOURCE_EXHAUSTED:
        return None
    hint = _trailing(error, RETRY_AFTER_KEY)
    if hint is None:
        return None
    try:
        ms = int(hint)
    except ValueError:
        return 1.0
    return 1.0 if ms < 0 else min(ms / 1000.0, 60.0)


FINISH_REASONS = {None: 0, "": 0, "stop": 1, "length": 2}

SubmitResult = collections.namedtuple(
    "SubmitResult", "batch_id accepted_groups accepted_responses learner_version queue_depth_groups "
                    "duplicate attempts")
StreamResult = collections.namedtuple(
    "StreamResult", "accepted_batches accepted_groups accepted_responses duplicate_batches "
                    "learner_version attempts")


def response(tokens, reward, behavior_logprobs=None, finish_reason=None, first_policy_version=None,
             last_policy_version=None):
    """One scored response (asympo.v1 Response). finish_reason: "stop",
    "length" or None. first_policy_version, last_policy_version: the
    versions of the weights that sampled its first and last token (None:
    unset; last defaults to first when only first is given)."""
    if finish_reason not in FINISH_REASONS:
        raise InvalidBatchError("finish_reason %r: expected 'stop', 'length' or None" % finish_reason)
    out = rollout_pb2.Response(tokens=list(tokens), reward=float(reward),
                               behavior_logprobs=list(behavior_logprobs or []),
                               finish_reason=FINISH_REASONS[finish_reason])
    if first_policy_version is not None:
        out.first_policy_version = _version(first_policy_version, "first_policy_version")
        out.last_policy_version = out.first_policy_version
    if last_policy_version is not None:
        out.last_policy_version = _version(last_policy_version, "last_policy_version")
    return out


def _version(v, what):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
        raise InvalidBatchError("%s %r: expected an integer in [0, 2^64)" % (what, v))
    return v


def stamp_policy_version(groups, version):
    """Sets first_policy_version and last_policy_version to `version` on
    every response of `groups` (PromptGroup messages) that carries neither;
    None leaves them as they are."""
    if version is None:
        return
    version = _version(version, "policy_version")
    for g in groups:
        for r in g.responses:
            if not r.HasField("first_policy_version") and not r.HasField("last_policy_version"):
                r.first_policy_version = version
                r.last_policy_version = version


def _stamped(g, version):
    """`g`, or a stamped copy of it when a response of it carries no version
    (the caller's message is left as it is)."""
    for r in g.responses:
        if not r.HasField("first_policy_version") and not r.HasField("last_policy_version"):
            copy = rollout_pb2.PromptGroup()
            copy.CopyFrom(g)
            stamp_policy_version([copy], version)
            return copy
    return g


def group(prompt_tokens, responses, prompt_id="", policy_version=None):
    """A prompt group (asympo.v1 PromptGroup). `responses`: Response
    messages, (tokens, reward) pairs or dicts with the Response fields.
    policy_version: stamped on the responses that carry no version."""
    out = rollout_pb2.PromptGroup(prompt_id=prompt_id, prompt_tokens=list(prompt_tokens))
    for r in responses:
        if isinstance(r, rollout_pb2.Response):
            out.responses.append(r)
        elif isinstance(r, dict):
            out.responses.append(response(r["tokens"], r["reward"], r.get("behavior_logprobs"),
                                          r.get("finish_reason"), r.get("first_policy_version"),
                                          r.get("last_policy_version")))
        else:
            tokens, reward = r
            out.responses.append(response(tokens, reward))
    stamp_policy_version([out], policy_version)
    return out


def _as_group(g):
    if isinstance(g, rollout_pb2.PromptGroup):
        return g
    if isinstance(g, dict):
        return group(g["prompt_tokens"], g["responses"], g.get("prompt_id", ""))
    raise InvalidBatchError("a group must be a PromptGroup or a dict, not %s" % type(g).__name__)


def _trailing(error, key):
    for k, v in (error.trailing_metadata() or ()):
        if k == key:
            return v
    return None


class _Backoff:
    """The wait before a retry, within a deadline: the learner's hint when
    there is one, else min_backoff doubling up to max_backoff; both plus up
    to 20% jitter (as SubmitBackoff in common/submit_retry.h). Every
    attempt's timeout is cut to what is left of the deadline, so that
    retry_deadline bounds the whole wait, an unreachable learner's too."""

    def __init__(self, client, what="call"):
        self.client, self.what, self.attempt = client, what, 0
        self.current = client.min_backoff
        self.start = time.monotonic()
        self.deadline = self.start + client.retry_deadline

    def timeout(self, timeout):
        """The next attempt's timeout: `timeout` (None: the client's), at
        most what is left of the deadline."""
        left = max(self.deadline - time.monotonic(), 0.001)
        return min(timeout or self.client.timeout, left)

    def wait(self, error, what=None):
        """Sleeps before the next attempt, or raises once the budget is
        spent. what: names the call in the error (default: as constructed)."""
        self.what = what or self.what
        self.attempt += 1
        code = error.code()
        delay = retry_hint(error)
        if delay is None:
            delay = self.current
            self.current = min(self.current * 2, self.client.max_backoff)
        delay *= 1 + 0.2 * random.random()
        if time.monotonic() + delay >= self.deadline or (
                self.client.max_attempts and self.attempt >= self.client.max_attempts):
            raise self.give_up(code, error.details())
        time.sleep(delay)

    def give_up(self, code, details):
        """The error that ends the retries: LearnerBusyError for a full
        queue, else LearnerUnavailableError, naming the target, the attempts
        and the seconds waited."""
        cls = LearnerBusyError if code == grpc.StatusCode.RESOURCE_EXHAUSTED else LearnerUnavailableError
        return cls("%s to %s: gave up after %d attempts in %.1f s (retry_deadline %g s, max_attempts %d); "
                   "the last answer: %s: %s" % (self.what, self.client.target, self.attempt,
                                                time.monotonic() - self.start, self.client.retry_deadline,
                                                self.client.max_attempts, code.name, details),
                   code=code, attempts=self.attempt)


class LearnerClient:
    """A client of the Learner service. Thread-safe: submits may run on many
    threads; batch ids stay unique."""

    def __init__(self, target, source="", credentials=None, timeout=60.0, retry_deadline=300.0,
                 max_attempts=0, min_backoff=0.1, max_backoff=10.0, validate=True, channel=None,
                 session=None, weights=None):
        """target: "host:port". credentials: grpc.ChannelCredentials for TLS
        (None: a plaintext channel). timeout: seconds per attempt (cut to
        what is left of retry_deadline). retry_deadline: seconds a submit,
        a stream or status() keeps retrying, an unreachable learner
        included (LearnerUnavailableError names the target, the attempts
        and the seconds waited); max_attempts: 0 for no limit besides it. session: the middle part of generated batch
        ids (default: random); give the same one to resume a run whose
        batches must keep their ids. weights: the WeightSubscriber whose
        reported version (what the engine samples with, report()) stamps
        the responses a batch sends without a policy version; right when
        the engine loads weights only between generations (else pass
        policy_version, or set each response's versions)."""
        if len(source.encode()) > validation.MAX_SOURCE_BYTES:
            raise InvalidBatchError("source is %d bytes, more than %d" % (len(source.encode()),
                                                                           validation.MAX_SOURCE_BYTES))
        self.target, self.source, self.timeout = target, source, timeout
        self.retry_deadline, self.max_attempts = retry_deadline, max_attempts
        self.min_backoff, self.max_backoff, self.validate = min_backoff, max_backoff, validate
        options = [("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20)]
        if channel is None:
            channel = (grpc.secure_channel(target, credentials, options) if credentials is not None
                       else grpc.insecure_channel(target, options))
        self._channel = channel
        self._stub = learner_pb2_grpc.LearnerStub(channel)
        # Submit with the request already serialized: the bytes validation
        # read are the bytes sent (and kept for a resend).
        self._submit_bytes = channel.unary_unary("/asympo.v1.Learner/Submit", request_serializer=None,
                                                 response_deserializer=learner_pb2.SubmitResponse.FromString)
        self.session = session or os.urandom(8).hex()
        self._lock = threading.Lock()
        self._next = 0
        self._status = None
        self.weights = weights

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def status(self, timeout=None, wait_for_ready=True):
        """The learner's LearnerStatus (version, queue, counters, limits),
        fetched now. Waits for the connection up to `timeout` (None: the
        client's) per attempt, retrying until retry_deadline."""
        backoff = _Backoff(self, "GetStatus")
        while True:
            try:
                st = self._stub.GetStatus(learner_pb2.GetStatusRequest(), timeout=backoff.timeout(timeout),
                                          wait_for_ready=wait_for_ready)
                self._status = st
                return st
            except grpc.RpcError as e:
                if decide_get_status(e.code(), retry_hint(e) is not None) != RETRY:
                    raise RefusedError("GetStatus: %s: %s" % (e.code().name, e.details()), e.code())
                backoff.wait(e)

    @property
    def limits(self):
        """The learner's BatchLimits (fetched once, then cached)."""
        return (self._status or self.status()).limits

    def new_batch_id(self):
        with self._lock:
            n = self._next
            self._next += 1
        return "%s/%s/%d" % (self.source[:64], self.session, n)

    def default_policy_version(self):
        """The version a batch without one is stamped with: the weight
        subscriber's (None without one, or before it loaded any)."""
        return None if self.weights is None else self.weights.version

    def make_batch(self, groups, batch_id=None, policy_version=None):
        """A RolloutBatch of `groups` (PromptGroup messages or dicts) with
        this client's source and a new batch id (or `batch_id`), validated
        against the learner's limits. Responses without a policy version
        get `policy_version`, else default_policy_version()."""
        batch = self._build_batch(groups, batch_id, policy_version)
        self._encode(batch)
        return batch

    def _build_batch(self, groups, batch_id, policy_version):
        batch = rollout_pb2.RolloutBatch(source=self.source, groups=[_as_group(g) for g in groups],
                                         batch_id=self.new_batch_id() if batch_id is None else batch_id)
        stamp_policy_version(batch.groups, self.default_policy_version() if policy_version is None
                             else policy_version)
        return batch

    def _encode(self, batch):
        """The batch's wire bytes, validated first unless validate=False."""
        if self.validate:
            return validation.encode_valid_batch(batch, self._status or self.status())
        return batch.SerializeToString()

    def submit(self, groups_or_batch, batch_id=None, timeout=None, policy_version=None):
        """Sends one batch, retrying with the same batch id until the learner
        accepts it (SubmitResult.duplicate: it had already been accepted).
        policy_version: as make_batch's (a RolloutBatch given whole is
        stamped only with an explicit one). Raises InvalidBatchError,
        RefusedError, LearnerBusyError or LearnerUnavailableError."""
        if isinstance(groups_or_batch, rollout_pb2.RolloutBatch):
            batch = groups_or_batch
            stamp_policy_version(batch.groups, policy_version)
        else:
            # The groups are serialized as they are, not copied into one
            # message first (a copy only where a version is stamped).
            version = self.default_policy_version() if policy_version is None else policy_version
            groups = [_as_group(g) for g in groups_or_batch]
            if version is not None:
                version = _version(version, "policy_version")
                groups = [_stamped(g, version) for g in groups]
            batch = validation.BatchOfGroups(groups, self.source,
                                             self.new_batch_id() if batch_id is None else batch_id)
        payload = self._encode(batch)
        backoff = _Backoff(self, "batch " + (batch.batch_id or "(no id)"))
        while True:
            try:
                r = self._submit_bytes(payload, timeout=backoff.timeout(timeout), wait_for_ready=True)
                return SubmitResult(batch.batch_id, r.accepted_groups, r.accepted_responses,
                                    r.learner_version, r.queue_depth_groups, r.duplicate_batches > 0,
                                    backoff.attempt + 1)
            except grpc.RpcError as e:
                self._raise_if_final(e, "batch %s" % (batch.batch_id or "(no id)"))
                backoff.wait(e)

    def submit_stream(self, batches, timeout=None):
        """Sends many batches on one SubmitStream (each a RolloutBatch or a
        list of groups; each gets its own batch id). After a retryable
        failure the stream is opened again from the first batch the learner
        did not confirm (trailing metadata asympo-accepted-batches)."""
        pending = [b if isinstance(b, rollout_pb2.RolloutBatch) else self.make_batch(b)
                   for b in batches]
        total = collections.Counter()
        backoff = _Backoff(self, "stream of %d batches" % len(pending))
        while pending:
            try:
                r = self._stub.SubmitStream(iter(pending), timeout=backoff.timeout(timeout),
                                            wait_for_ready=True)
                total.update(batches=r.accepted_batches, groups=r.accepted_groups,
                             responses=r.accepted_responses, duplicates=r.duplicate_batches)
                return StreamResult(total["batches"], total["groups"], total["responses"],
                                    total["duplicates"], r.learner_version, backoff.attempt + 1)
            except grpc.RpcError as e:
                done = _trailing(e, ACCEPTED_BATCHES_KEY)
                done = int(done) if done and done.isdigit() else 0
                for b in pending[:done]:
                    total.update(batches=1, groups=len(b.groups),
                                 responses=sum(len(g.responses) for g in b.groups))
                pending = pending[done:]
                self._raise_if_final(e, "stream batch %s" % (pending[0].batch_id if pending else "-"))
                backoff.wait(e)
        return StreamResult(total["batches"], total["groups"], total["responses"],
                            total["duplicates"], 0, backoff.attempt + 1)

    def _raise_if_final(self, e, what):
        """Raises unless the policy retries the answer (docs/protocol.md,
        "Retries")."""
        code = e.code()
        decision = decide_submit(code, retry_hint(e) is not None)
        if decision == DROP_BATCH:
            self._status = None  # the limits may have changed (a restarted learner)
            raise InvalidBatchError("%s: the learner refused it: %s" % (what, e.details())) from None
        if decision == FATAL:
            raise RefusedError("%s: %s: %s" % (what, code.name, e.details()), code) from None
