"""LearnerClient: submits rollout batches to an asympo-learner.

    client = LearnerClient("learner:50051", source="vllm-0")
    print(client.status().limits)
    result = client.submit([group(prompt_tokens, [(tokens, reward), ...]), ...])

Every batch gets a batch_id unless one is given, "<source>/<session>/<n>",
or "<source>/<session>/<sub>/<n>" with session= (<sub>: random, new for
every LearnerClient), so that a retry after a lost reply is acknowledged by
the learner as a duplicate and trained once (docs/protocol.md,
"Exactly-once"), and new data never reuses an id: a batch id names one
payload, and the learner refuses an old id with new data
(ALREADY_EXISTS). Every answer
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
batch dropped; sample again with newer weights).

Recovery after a learner restart (docs/protocol.md): the client keeps every
accepted batch, as the bytes it sent, with its reply's learner_incarnation
and learner_version, until it is confirmed: GetStatus of the same
incarnation reports recorded_through_version above that version (in the
learner's checkpoint; confirm_at="trained" confirms at
trained_through_version, for a learner without --checkpoint_dir, whose
restart starts over anyway). Every status() and confirm() forgets the
confirmed ones. When a reply or the status shows another incarnation, the
unconfirmed batches are sent again with their own ids (resend_unconfirmed)
before the client's next new batch: the learner answers the recorded ones
as duplicates and queues the others, so a learner killed and restarted from
its checkpoint loses nothing and trains nothing twice:

    client = LearnerClient("learner:50051", source="vllm-0", session="run-7")
    client.submit(groups)          # kept until confirmed
    client.confirm()               # GetStatus: forget what is recorded
                                   # (submits also do, every confirm_every s)
    client.unconfirmed()           # [(batch_id, incarnation, version), ...]

At most max_unconfirmed batches (1000; one more per thread that submits at
the same moment) are kept: at the bound a submit asks GetStatus again with
the backoff until some are confirmed, up to retry_deadline, then raises
LearnerBusyError without sending; 0 keeps none (no recovery). A resent
batch the learner now refuses for good is forgotten and listed in
client.resend_refused; one it answers as a duplicate its checkpoint records
in full (SubmitResponse.recorded_duplicates) is confirmed at once."""
import collections
import os
import random
import threading
import time

import grpc

from . import validation
from ._stubs import learner_pb2, learner_pb2_grpc, rollout_pb2
from .errors import InvalidBatchError, LearnerBusyError, RefusedError
from .recovery import Unconfirmed
from .retry import (ACCEPTED, ACCEPTED_BATCHES_KEY, DROP_BATCH, FATAL, RETRY, RETRY_AFTER_KEY,  # noqa: F401
                    SUBMIT_POLICY, decide_get_status, decide_submit, retry_hint, trailing as _trailing)
from .retry import Backoff as _Backoff, WaitLine as _WaitLine

FINISH_REASONS = {None: 0, "": 0, "stop": 1, "length": 2}

SubmitResult = collections.namedtuple(
    "SubmitResult", "batch_id accepted_groups accepted_responses learner_version queue_depth_groups "
                    "duplicate attempts learner_incarnation")
StreamResult = collections.namedtuple(
    "StreamResult", "accepted_batches accepted_groups accepted_responses duplicate_batches "
                    "learner_version attempts learner_incarnation")


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


def _recorded_duplicate(reply):
    """Whether a Submit reply acknowledges its batch as a duplicate that the
    checkpoint the learner resumed from records as trained in full: confirmed
    at once (SubmitResponse.recorded_duplicates; 0 from a learner without
    the field)."""
    return getattr(reply, "recorded_duplicates", 0) > 0


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


class LearnerClient:
    """A client of the Learner service. Thread-safe: submits may run on many
    threads; batch ids stay unique."""

    def __init__(self, target, source="", credentials=None, timeout=60.0, retry_deadline=300.0,
                 max_attempts=0, min_backoff=0.1, max_backoff=10.0, validate=True, channel=None,
                 session=None, weights=None, max_unconfirmed=1000, confirm_at="recorded",
                 confirm_every=10.0):
        """target: "host:port". credentials: grpc.ChannelCredentials for TLS
        (None: a plaintext channel). timeout: seconds per attempt (cut to
        what is left of retry_deadline). retry_deadline: seconds a submit,
        a stream or status() keeps retrying, an unreachable learner
        included (LearnerUnavailableError names the target, the attempts
        and the seconds waited); max_attempts: 0 for no limit besides it.
        session: names the run in the generated batch ids (default:
        random); each client adds a random sub-session of its own, so a
        generator restarted with the same session never reuses an id of
        its earlier process for new data. Batches sent again keep the ids
        they were sent with (submit(..., batch_id=), resend_unconfirmed()).
        Raises InvalidBatchError when source and session leave the ids no
        room within max_batch_id_bytes. weights: the WeightSubscriber whose
        reported version (what the engine samples with, report()) stamps
        the responses a batch sends without a policy version; right when
        the engine loads weights only between generations (else pass
        policy_version, or set each response's versions).
        max_unconfirmed, confirm_at: the recovery rule (the module's
        docstring): the most accepted batches kept until the learner
        confirms them (0: none kept, no recovery), and what confirms one:
        "recorded" (in the learner's checkpoint) or "trained" (for a
        learner without --checkpoint_dir, whose restart starts over).
        confirm_every: seconds between the confirmations a submit makes on
        its own (one GetStatus, after an accepted batch, when batches are
        kept and the last status is older), so that a caller who never
        calls confirm() keeps only the batches of the last checkpoint
        interval, and a learner restart resends only those; 0: only
        confirm() and status() confirm."""
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
        self._stream_bytes = channel.stream_unary("/asympo.v1.Learner/SubmitStream", request_serializer=None,
                                                  response_deserializer=learner_pb2.SubmitResponse.FromString)
        self.session = session or os.urandom(8).hex()
        self.sub_session = os.urandom(6).hex() if session else ""
        parts = [self.source[:64], self.session] + ([self.sub_session] if session else [])
        self._id_prefix = "/".join(parts) + "/"
        self._check_id_bytes(self._id_prefix + "0", validation.MAX_BATCH_ID_BYTES)
        self._lock = threading.Lock()
        self._line = _WaitLine()
        self._next = 0
        self._status = None
        self.weights = weights
        self._kept = Unconfirmed(max_unconfirmed, confirm_at)
        if isinstance(confirm_every, bool) or not isinstance(confirm_every, (int, float)) or confirm_every < 0:
            raise ValueError("confirm_every %r: expected seconds >= 0" % (confirm_every,))
        self.confirm_every = confirm_every
        self._status_at = time.monotonic()  # when status() last answered
        self._resend_lock = threading.Lock()
        self.resend_refused = []  # (batch_id, message): resent batches the learner refused for good

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
                self._status_at = time.monotonic()
                self._kept.see(st)
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
        """The next generated batch id, checked against the learner's
        max_batch_id_bytes when its limits are known."""
        with self._lock:
            n = self._next
            self._next += 1
        batch_id = self._id_prefix + str(n)
        if self._status is not None:
            limit = self._status.limits.max_batch_id_bytes or validation.MAX_BATCH_ID_BYTES
            self._check_id_bytes(batch_id, limit)
        return batch_id

    def _check_id_bytes(self, batch_id, limit):
        if len(batch_id.encode()) > limit:
            raise InvalidBatchError(
                "batch id %r is %d bytes, more than max_batch_id_bytes %d: shorten session= (%d bytes) or "
                "source= (%d bytes)" % (batch_id, len(batch_id.encode()), limit, len(self.session.encode()),
                                        len(self.source.encode())))

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
        batch, payload = self._prepare(groups_or_batch, batch_id, policy_version)
        self._before_new_data()
        what = "batch " + (batch.batch_id or "(no id)")
        r, attempts = self._retrying(
            what, lambda t: self._submit_bytes(payload, timeout=t, wait_for_ready=True), timeout)
        if _recorded_duplicate(r):
            self._kept.forget(batch.batch_id)
        else:
            self._accepted([(batch.batch_id, payload, r.learner_incarnation)], r.learner_version)
        return SubmitResult(batch.batch_id, r.accepted_groups, r.accepted_responses, r.learner_version,
                            r.queue_depth_groups, r.duplicate_batches > 0, attempts, r.learner_incarnation)

    def _prepare(self, groups_or_batch, batch_id, policy_version):
        """(batch, payload): a RolloutBatch given whole (stamped only with an
        explicit policy_version), or the groups with this client's source
        and batch_id (else a new one), and its validated wire bytes."""
        if isinstance(groups_or_batch, rollout_pb2.RolloutBatch):
            batch = groups_or_batch
            stamp_policy_version(batch.groups, policy_version)
        else:
            # The groups are serialized as they are, not copied into one
            # message first; a version is stamped in the bytes.
            version = self.default_policy_version() if policy_version is None else policy_version
            batch = validation.BatchOfGroups(
                [_as_group(g) for g in groups_or_batch], self.source,
                self.new_batch_id() if batch_id is None else batch_id,
                None if version is None else _version(version, "policy_version"))
        return batch, self._encode(batch)

    def submit_stream(self, batches, timeout=None):
        """Sends many batches on one SubmitStream (each a RolloutBatch or a
        list of groups; each gets its own batch id). After a retryable
        failure the stream is opened again from the first batch the learner
        did not confirm (trailing metadata asympo-accepted-batches)."""
        pending = []  # (batch_id, payload, groups, responses)
        for b in batches:
            batch, payload = self._prepare(b, None, None)
            pending.append((batch.batch_id, payload, len(batch.groups),
                            sum(len(g.responses) for g in batch.groups)))
        total, early = collections.Counter(), []  # early: accepted before a failed attempt
        self._before_new_data()

        def attempt(t):
            try:
                return self._stream_bytes(iter([p[1] for p in pending]), timeout=t, wait_for_ready=True)
            except grpc.RpcError as e:
                done = _trailing(e, ACCEPTED_BATCHES_KEY)
                done = int(done) if done and done.isdigit() else 0
                for _, _, groups, responses in pending[:done]:
                    total.update(batches=1, groups=groups, responses=responses)
                early.extend(pending[:done])
                del pending[:done]
                raise
        r, attempts = self._retrying("stream of %d batches" % len(pending), attempt, timeout)
        total.update(batches=r.accepted_batches, groups=r.accepted_groups,
                     responses=r.accepted_responses, duplicates=r.duplicate_batches)
        # The reply's version is the stream's last: at or above each batch's
        # own, so confirming at it is safe. Those accepted before a failure
        # have no known incarnation: sent again (as duplicates, or queued
        # when their learner restarted) to learn it.
        self._accepted([(b[0], b[1], None) for b in early] +
                       [(b[0], b[1], r.learner_incarnation) for b in pending], r.learner_version)
        return StreamResult(total["batches"], total["groups"], total["responses"], total["duplicates"],
                            r.learner_version, attempts, r.learner_incarnation)

    def unconfirmed(self):
        """(batch_id, learner_incarnation, learner_version) of every batch
        kept until the learner confirms it, oldest first."""
        return self._kept.listing()

    def confirm(self):
        """Asks the learner (GetStatus) which kept batches it has recorded
        (confirm_at="trained": trained) and forgets those; when it has
        restarted since a batch was accepted, sends that batch again
        (resend_unconfirmed). Returns how many batches stay unconfirmed."""
        self.status()
        if self._kept.has_stale():
            self.resend_unconfirmed()
        return len(self._kept)

    def resend_unconfirmed(self, timeout=None):
        """Sends again, each with its own batch id and bytes, every kept
        batch accepted by an earlier learner incarnation than the newest
        seen: the learner answers those its checkpoint recorded as
        duplicates (confirmed at once when it says the checkpoint records
        them in full, SubmitResponse.recorded_duplicates) and queues the
        others. submit, submit_stream and
        confirm call it when a reply or the status shows a restart; a
        batch the learner now refuses for good is forgotten and listed in
        resend_refused. Returns the number of batches sent again."""
        sent = 0
        with self._resend_lock:
            while self._kept.has_stale():
                for k in self._kept.stale():
                    def send(t, payload=k.payload):
                        return self._submit_bytes(payload, timeout=t, wait_for_ready=True)
                    try:
                        r, _ = self._retrying("resent batch " + k.batch_id, send, timeout)
                    except InvalidBatchError as e:
                        self._kept.forget(k.batch_id)
                        self.resend_refused.append((k.batch_id, str(e)))
                        continue
                    if _recorded_duplicate(r):
                        self._kept.forget(k.batch_id)
                    else:
                        self._kept.record(k.batch_id, k.payload, r.learner_incarnation, r.learner_version)
                    sent += 1
        return sent

    def _accepted(self, batches, learner_version):
        """Keeps (batch_id, payload, incarnation) accepted at learner_version;
        sends the stale ones again when the reply shows a restart."""
        stale = False
        for batch_id, payload, incarnation in batches:
            stale = self._kept.record(batch_id, payload, incarnation, learner_version)
        if stale:
            self.resend_unconfirmed()
        elif (self.confirm_every and len(self._kept) and
              time.monotonic() - self._status_at >= self.confirm_every):
            self._status_at = time.monotonic()  # one confirmation at a time across threads
            self.confirm()

    def _before_new_data(self):
        """The recovery rule's order: after a restart, the unconfirmed
        batches go before new data; at max_unconfirmed, waits for the
        learner to confirm some (GetStatus, with the backoff) until
        retry_deadline, then raises LearnerBusyError (the new batch is not
        sent)."""
        if self._kept.has_stale():
            self.resend_unconfirmed()
        start, delay = time.monotonic(), self.min_backoff
        while self._kept.full() and self.confirm() >= self._kept.limit:
            if time.monotonic() + delay > start + self.retry_deadline:
                at = self._kept.confirm_at
                raise LearnerBusyError(
                    "%s: %d batches wait for the learner to confirm them (max_unconfirmed %d, confirm_at %r; "
                    "its %s_through_version is %d); waited %.1f s. A learner without --checkpoint_dir never "
                    "records: use confirm_at='trained' for it" % (
                        self.target, len(self._kept), self._kept.limit, at, at,
                        getattr(self._status, at + "_through_version", 0), time.monotonic() - start),
                    code=None, attempts=0)
            time.sleep(delay * (1 + 0.2 * random.random()))
            delay = min(delay * 2, self.max_backoff)

    def _retrying(self, what, attempt, timeout=None):
        """(attempt(t)'s answer, attempts): attempt (a call with timeout t)
        made again under the retry policy until it is answered, raising
        what the policy makes final; waiting fairly with the client's other
        submissions (_WaitLine)."""
        backoff = _Backoff(self, what)
        ticket, in_line = self._line.arrive()
        last = None
        try:
            while True:
                if in_line and not self._line.wait_turn(ticket, backoff.deadline):
                    raise backoff.give_up(last.code() if last else None,
                                          (last.details() if last else "") + "; waited in line behind the "
                                          "client's earlier submissions")
                try:
                    return attempt(backoff.timeout(timeout)), backoff.attempt + 1
                except grpc.RpcError as e:
                    last = e
                    self._raise_if_final(e, backoff.what)
                    self._line.join(ticket)
                    in_line = True
                    if self._line.first(ticket):
                        backoff.wait(e)
                    else:
                        backoff.count(e)
        finally:
            self._line.leave(ticket)

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
