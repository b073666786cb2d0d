"""The client's one Submit retry policy (docs/protocol.md, "Retries"; the
same table as the C++ tools' common/submit_retry.h), the backoff within
retry_deadline, and the line in which one client's waiting submissions are
served in arrival order."""
import bisect
import random
import threading
import time

import grpc

from .errors import LearnerBusyError, LearnerUnavailableError

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
    hint = trailing(error, RETRY_AFTER_KEY)
    if hint is None:
        return None
    try:
        ms = int(hint)
    except ValueError:
        return 1.0
    return 1.0 if ms < 0 else min(ms / 1000.0, 60.0)


def trailing(error, key):
    for k, v in (error.trailing_metadata() or ()):
        if k == key:
            return v
    return None


class Backoff:
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

    def count(self, error):
        """An attempt that failed while others wait first in line: counted
        against max_attempts, no sleep (its turn comes when theirs ends)."""
        self.attempt += 1
        if self.client.max_attempts and self.attempt >= self.client.max_attempts:
            raise self.give_up(error.code(), error.details())

    def give_up(self, code, details):
        """The error that ends the retries: LearnerBusyError for a full
        queue, else LearnerUnavailableError, naming the target, the attempts
        and the seconds waited."""
        cls = LearnerBusyError if code == grpc.StatusCode.RESOURCE_EXHAUSTED else LearnerUnavailableError
        return cls("%s to %s: gave up after %d attempts in %.1f s (retry_deadline %g s, max_attempts %d); "
                   "the last answer: %s: %s" % (self.what, self.client.target, self.attempt,
                                                time.monotonic() - self.start, self.client.retry_deadline,
                                                self.client.max_attempts, code.name if code else "none",
                                                details),
                   code=code, attempts=self.attempt)


class WaitLine:
    """One client's submissions that wait for the learner (a full queue, an
    unreachable or failing learner), served in arrival order: each
    submission takes a ticket when it starts; once one has been refused,
    only the first ticket in line retries (after the hint or the backoff),
    the others wait for their turn and try at once when it comes, and a
    submission that starts while some wait joins the line instead of
    trying ahead of it. With nobody waiting, submissions go straight to the
    learner, in parallel. So no waiter is overtaken by a later one, as
    independent exponential backoffs would let happen."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = 0
        self._line = []  # tickets, sorted

    def arrive(self):
        """(ticket, in_line): in_line when others wait (it waits behind them)."""
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            if self._line:
                bisect.insort(self._line, ticket)
            return ticket, bool(self._line)

    def join(self, ticket):
        with self._cond:
            if ticket not in self._line:
                bisect.insort(self._line, ticket)

    def first(self, ticket):
        with self._cond:
            return self._line[0] == ticket

    def wait_turn(self, ticket, deadline):
        """Waits until `ticket` is first in line; False if `deadline`
        (time.monotonic()) comes first."""
        with self._cond:
            while self._line[0] != ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def leave(self, ticket):
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
                self._cond.notify_all()
