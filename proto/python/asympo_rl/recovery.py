"""The batches a LearnerClient keeps until the learner confirms them, for the
recovery rule of docs/protocol.md ("Recovery after a learner restart"):
every accepted batch is kept, as the bytes it was sent as, with the
learner_incarnation and learner_version of its reply, until GetStatus of
the same incarnation reports recorded_through_version (or, with
confirm_at="trained", trained_through_version) above that version. A batch
kept under another incarnation than the newest one seen is stale: the
learner restarted since it was accepted, and it must be sent again with
its same id. Thread-safe."""
import collections
import threading

Kept = collections.namedtuple("Kept", "batch_id payload incarnation learner_version")
CONFIRM_AT = ("recorded", "trained")


class Unconfirmed:
    def __init__(self, limit, confirm_at):
        """limit: the most batches kept (0: none; the client then follows no
        recovery rule). confirm_at: "recorded" (the learner's checkpoint
        holds the batch) or "trained" (for a learner without checkpoints)."""
        if confirm_at not in CONFIRM_AT:
            raise ValueError("confirm_at %r: expected 'recorded' or 'trained'" % (confirm_at,))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError("max_unconfirmed %r: expected an integer >= 0" % (limit,))
        self.limit, self.confirm_at = limit, confirm_at
        self._lock = threading.Lock()
        self._kept = collections.OrderedDict()  # batch_id -> Kept, oldest first
        self._per_incarnation = collections.Counter()  # of self._kept
        self.incarnation = ""  # the newest incarnation seen ("" before any)

    def __len__(self):
        with self._lock:
            return len(self._kept)

    def full(self):
        with self._lock:
            return bool(self.limit) and len(self._kept) >= self.limit

    def record(self, batch_id, payload, incarnation, learner_version):
        """Keeps an accepted batch (incarnation None: not known, so stale).
        Returns whether any kept batch is stale now."""
        with self._lock:
            if self.limit:
                self._drop(batch_id)
                self._kept[batch_id] = Kept(batch_id, payload, incarnation, learner_version)
                self._per_incarnation[incarnation] += 1
            if incarnation:
                self.incarnation = incarnation
            return self._any_stale()

    def see(self, status):
        """Forgets the batches `status` (a LearnerStatus) confirms; returns
        whether any kept batch is stale (the learner restarted)."""
        through = (status.recorded_through_version if self.confirm_at == "recorded"
                   else status.trained_through_version)
        with self._lock:
            if status.incarnation:
                self.incarnation = status.incarnation
            if self._per_incarnation[status.incarnation]:
                for k in [k for k in self._kept.values()
                          if k.incarnation == status.incarnation and k.learner_version < through]:
                    self._drop(k.batch_id)
            return self._any_stale()

    def stale(self):
        """The kept batches accepted by another incarnation than the newest
        one seen, oldest first."""
        with self._lock:
            return [k for k in self._kept.values() if k.incarnation != self.incarnation]

    def has_stale(self):
        with self._lock:
            return self._any_stale()

    def _any_stale(self):
        return len(self._kept) > self._per_incarnation[self.incarnation]

    def _drop(self, batch_id):
        k = self._kept.pop(batch_id, None)
        if k is not None:
            self._per_incarnation[k.incarnation] -= 1

    def forget(self, batch_id):
        with self._lock:
            self._drop(batch_id)

    def listing(self):
        """(batch_id, incarnation, learner_version) of every kept batch."""
        with self._lock:
            return [(k.batch_id, k.incarnation, k.learner_version) for k in self._kept.values()]
