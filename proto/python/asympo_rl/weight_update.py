"""WeightUpdate: one version arriving over the learner's weight group,
bucket by bucket, for WeightGroupReceiver (asympo_rl.weight_group), which
drives the collectives and the gRPC fallback."""
import torch

from ._stubs import weight_broadcast_pb2 as wb
from .errors import WeightsError

_TORCH_DTYPES = {wb.DTYPE_F32: torch.float32, wb.DTYPE_BF16: torch.bfloat16, wb.DTYPE_F16: torch.float16}
_ITEM_BYTES = {wb.DTYPE_F32: 4, wb.DTYPE_BF16: 2, wb.DTYPE_F16: 2}


class _GroupFailed(Exception):
    """A collective of the group failed; the receiver has left the group.
    unreachable: the learner did not answer either (no gRPC fallback)."""

    def __init__(self, message, unreachable=False):
        super().__init__(message)
        self.unreachable = unreachable


class WeightUpdate:
    """One version arriving over the group: version, incarnation, manifest.
    Iterate it once, promptly: (Hugging Face name, tensor) pairs on the
    receiver's device as each bucket arrives (buckets() gives them a
    bucket at a time). The tensors are views of the bucket's own buffer,
    safe to keep. Iteration raises WeightsError when the version cannot be
    completed (its fallback fetch failed, or a newer version replaced it).

    After it: complete (every tensor yielded), ok (every bucket came over
    the group with its CRC-32C), crc_failed (a bucket that came over the
    group did not match its CRC-32C), group_failed (a collective failed),
    fetched (buckets that came over gRPC instead), error (why iterating it
    raised)."""

    def __init__(self, receiver, manifest):
        self.manifest = manifest
        self._receiver = receiver
        self._layout = [[] for _ in manifest.buckets]
        for t in manifest.tensors:
            if t.bucket < len(self._layout):  # else check_manifest refuses it
                self._layout[t.bucket].append(t)
        self._next = 0          # buckets taken so far
        self._fetch = None      # the gRPC fallback's bucket iterator, once in use
        self._started = self._over = False
        self.crc_failed = self.group_failed = False
        self.complete, self.ok, self.fetched, self.error = False, True, 0, ""

    @property
    def version(self):
        return self.manifest.version

    @property
    def incarnation(self):
        return self.manifest.incarnation

    def close(self):
        """Ends the update now: receives (and drops) the broadcasts not
        iterated to, so the group goes on without waiting for this member.
        Also done by the receiver's next call, and on leaving a `with`."""
        self._finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._finish()

    def __iter__(self):
        for pairs in self.buckets():
            yield from pairs

    def buckets(self):
        """Yields, per bucket in index order, the list of its (name, tensor)
        pairs (a bucket without tensors gives an empty list)."""
        if self._started or self._over:
            raise RuntimeError("the update of version %d is iterated once, before the next update"
                               % self.version)
        self._started = True
        try:
            while self._next < len(self.manifest.buckets):
                pairs = self._take()
                self._next += 1
                yield pairs
                del pairs
        except WeightsError as e:
            self.error = str(e)
            self._finish()
            raise
        self.complete = True
        self._finish()

    def _take(self):
        """The next bucket's (name, tensor) pairs, from the group or, once
        it failed or a CRC did not match, from the gRPC fallback."""
        rx, i = self._receiver, self._next
        info = self.manifest.buckets[i]
        if self._fetch is None:
            try:
                buf = rx._broadcast(info.size_bytes)
            except _GroupFailed as e:
                self.ok, self.group_failed = False, True
                if e.unreachable:
                    raise WeightsError("version %d: %s; nothing to fetch it from" % (self.version, e)) from None
            else:
                if rx._crc_matches(buf, info):
                    return _views(buf, self._layout[i])
                del buf
                self.ok, self.crc_failed = False, True
                # Keep the group in step: receive the rest of the version's
                # broadcasts now, then fetch what is missing.
                self._drain(i + 1)
            self._fetch = rx._fetch(self.manifest, i)
        index, buf = next(self._fetch)
        self.fetched += 1
        return _views(buf, self._layout[index])

    def _drain(self, start):
        """Receives (and drops) the broadcasts of buckets start.., while
        the group stands."""
        rx = self._receiver
        for info in self.manifest.buckets[start:]:
            try:
                buf = rx._broadcast(info.size_bytes)
            except _GroupFailed:
                self.ok, self.group_failed = False, True
                return
            if not rx._crc_matches(buf, info):
                self.ok, self.crc_failed = False, True
            del buf

    def _finish(self):
        """Ends the update (idempotent): receives the broadcasts the caller
        did not iterate to, closes a fallback fetch, and tells the receiver
        the outcome."""
        if self._over:
            return
        self._over = True
        if self._fetch is not None:
            self._fetch.close()  # its broadcasts were received before it began
            self._fetch = None
        elif not self.complete and self._receiver._pg is not None:
            self._drain(self._next)
        self._receiver._settle(self)


def _views(buf, entries):
    """[(name, tensor)] of one bucket's tensors: views of `buf` (1-D uint8),
    or copies where an offset does not suit the dtype's alignment."""
    out = []
    for t in entries:
        piece = buf[t.offset:t.offset + t.size_bytes]
        if t.offset % _ITEM_BYTES[t.dtype]:
            piece = piece.clone()
        out.append((t.name, piece.view(_TORCH_DTYPES[t.dtype]).reshape(tuple(t.shape))))
    return out
