"""WeightUpdate: one version arriving over the learner's weight group,
bucket by bucket, for WeightGroupReceiver (asympo_rl.weight_group), which
drives the collectives and the gRPC fallback."""
import time

import numpy
import torch

from . import delta
from ._stubs import weight_broadcast_pb2 as wb
from .crc32c import crc32c
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

    A delta update (from_delta; GroupNextResponse.delta) broadcasts each
    bucket's delta against the version the receiver holds; each is rebuilt
    from the receiver's copy of that version and checked like a whole one.

    After it: complete (every tensor yielded), ok (every bucket came over
    the group with its CRC-32C), crc_failed (a bucket that came over the
    group did not match its CRC-32C, or its delta did not rebuild it),
    group_failed (a collective failed), fetched (buckets that came over
    gRPC instead), error (why iterating it raised). started_at is
    time.monotonic() when the learner answered that the version goes out:
    time.monotonic() - started_at after the iteration is its transfer,
    checks and rebuild."""

    def __init__(self, receiver, manifest, delta_sizes=None):
        self.started_at = time.monotonic()
        self.manifest = manifest
        self._receiver = receiver
        # Bytes broadcast per bucket for a delta (0: the whole bucket).
        self._delta_sizes = list(delta_sizes) if delta_sizes is not None else None
        self.from_delta = delta_sizes is not None
        # The buckets' bytes on the host, kept as the base of the next delta.
        self.kept = [None] * len(manifest.buckets) if receiver.deltas else None
        # The receiver's copy of the version a delta is from (None: none fits).
        self._base = receiver._base_for(manifest) if self.from_delta else None
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

    def tensor_order(self):
        """The manifest's TensorInfo entries in the order iterating the
        update yields their tensors (bucket by bucket)."""
        return [t for entries in self._layout for t in entries]

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
                buf = rx._broadcast(self._size(i))
            except _GroupFailed as e:
                self.ok, self.group_failed = False, True
                if e.unreachable:
                    raise WeightsError("version %d: %s; nothing to fetch it from" % (self.version, e)) from None
            else:
                if self._is_delta(i):
                    buf = self._rebuild(i, buf)
                if buf is not None and (self._is_delta(i) or rx._crc_matches(buf, info)):
                    return self._keep(i, buf)
                del buf
                self.ok, self.crc_failed = False, True
                # Keep the group in step: receive the rest of the version's
                # broadcasts now, then fetch what is missing.
                self._drain(i + 1)
            self._fetch = rx._fetch(self.manifest, i)
        index, buf = next(self._fetch)
        self.fetched += 1
        return self._keep(index, buf)

    def _is_delta(self, i):
        return self._delta_sizes is not None and self._delta_sizes[i] > 0

    def _size(self, i):
        """The bytes of bucket i's broadcast."""
        return self._delta_sizes[i] if self._is_delta(i) else self.manifest.buckets[i].size_bytes

    def _keep(self, i, buf):
        """Bucket i's (name, tensor) pairs; with deltas, its bytes kept."""
        if self.kept is not None:
            self.kept[i] = buf.cpu().numpy()  # the buffer itself when it is on the CPU
        return _views(buf, self._layout[i])

    def _rebuild(self, i, buf):
        """Bucket i rebuilt from its delta `buf` and the receiver's copy of
        the base version, on the receiver's device, once its CRC-32C
        matches; None (the bucket then comes over gRPC) when it cannot be."""
        m = self.manifest
        if self._base is None:
            return None
        info = m.buckets[i]
        where = "version %d: bucket %d's delta against version %d" % (m.version, i, m.delta_base_version)
        out = numpy.empty(info.size_bytes, dtype=numpy.uint8)  # not zeroed: apply writes it whole
        try:
            delta.apply(self._base[i], buf.cpu().numpy(), out, where)
        except WeightsError:
            return None
        if crc32c(out) != info.crc32c:
            return None
        return torch.from_numpy(out).to(self._receiver.device)

    def _drain(self, start):
        """Receives (and drops) the broadcasts of buckets start.., while
        the group stands."""
        rx = self._receiver
        for i in range(start, len(self.manifest.buckets)):
            try:
                buf = rx._broadcast(self._size(i))
            except _GroupFailed:
                self.ok, self.group_failed = False, True
                return
            # A delta is checked once rebuilt: a drained one is not.
            if not self._is_delta(i) and not rx._crc_matches(buf, self.manifest.buckets[i]):
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
