"""Waiting for a weight group's collective without being held up by a dead
learner.

Gloo does not always see a peer die. A receiver whose peer is killed in
the middle of a message waits for the collective's whole timeout: with
torch 1.13's Gloo, a broadcast of 2 GiB whose root is killed (SIGKILL)
50 ms in ends only with "Timed out waiting 60000ms for recv operation to
complete" (a root killed before it sends is seen at once). A worker would
sit out the learner's restart for the weight group's collective timeout.

So a member waits for each collective in slices of `probe_s` seconds
(polling it) and, between slices, asks the learner whether its generation still stands (a
WeightGroup.Store CHECK of no key under its member token):

- the learner answers: the member waits on;
- the learner says the token names no member (FAILED_PRECONDITION: the
  generation ended, or the learner restarted): the member gives up at once;
- no answer (the learner is down, shutting down or unreachable) for
  `unreachable_s` seconds: the member gives up.

A process group given up on is kept, not destroyed: destroying one whose
collective is pending waits for that collective's timeout. It is dropped
once the collective ends (at its timeout at the latest); one still
pending when the process exits is left to the exit."""
import ctypes
import time

import grpc

from .v1 import weight_group_pb2 as wg

# Process groups given up on while a collective was pending, each with the
# pending work: (process group, work). Each group holds one reference of
# its own (Py_IncRef), so that neither this list's teardown at exit nor
# the caller dropping it runs its destructor, which would wait for the
# collective's timeout.
_GIVEN_UP = []


class LearnerGone(Exception):
    """The learner ended this member's generation, or (unreachable) stopped
    answering."""

    def __init__(self, message, unreachable=False):
        super().__init__(message)
        self.unreachable = unreachable


def give_up(pg, work):
    """Keeps `pg`, whose collective `work` is pending, until that ends."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))
    _GIVEN_UP.append((pg, work))
    drop_ended()


def drop_ended():
    """Drops the groups given up on whose collective has ended."""
    for entry in list(_GIVEN_UP):
        if entry[1].is_completed():
            _GIVEN_UP.remove(entry)
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(entry[0]))


class Watch:
    """Waits for one member's collectives, asking the learner between
    slices (see the module's docstring)."""

    def __init__(self, stub, member_token, probe_s=1.0, unreachable_s=10.0):
        """stub: a WeightGroupStub on the learner's channel. probe_s: the
        slice of waiting between two questions. unreachable_s: how long the
        learner may go without answering before the member gives up."""
        self._stub, self._token = stub, member_token
        self.probe_s, self.unreachable_s = probe_s, unreachable_s

    def wait(self, work):
        """Returns once `work` has completed. Raises its own error
        (RuntimeError) when it failed, LearnerGone when the learner ended
        the generation or did not answer for unreachable_s. It polls
        Work.is_completed (every 0.2 ms at first, at most every 5 ms) and
        asks the learner every probe_s; no thread waits inside the
        collective, so a process that gives one up and exits leaves no
        thread blocked in it (one would abort the exit: "terminate called
        without an active exception")."""
        silent_since, pause = None, 0.0002
        next_ask = time.monotonic() + self.probe_s
        while not work.is_completed():
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
            now = time.monotonic()
            if now < next_ask:
                continue
            gone, silence = self._ask()
            now = time.monotonic()
            next_ask = now + self.probe_s
            if gone is not None:
                raise LearnerGone("the learner no longer counts this member in a generation: %s" % gone)
            if silence is None:
                silent_since = None
            elif silent_since is None:
                silent_since = now
            elif now - silent_since >= self.unreachable_s:
                raise LearnerGone("the learner has not answered for %.0f s (%s)"
                                  % (now - silent_since, silence), unreachable=True)
        work.wait()  # completed: returns at once, or raises its error

    def _ask(self):
        """One question. Returns (gone, silence): gone, the learner's
        FAILED_PRECONDITION text (give up now); silence, why no answer came
        (None when the learner answered)."""
        try:
            self._stub.Store(wg.GroupStoreRequest(member_token=self._token, op=wg.GroupStoreRequest.OP_CHECK),
                             timeout=max(0.5, min(5.0, self.unreachable_s / 2)))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return e.details(), None
            return None, "%s: %s" % (e.code().name, e.details())
        return None, None
