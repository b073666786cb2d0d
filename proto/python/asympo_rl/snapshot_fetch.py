"""One version's transfer for WeightSubscriber.fetch: FetchSnapshot's chunks
into buckets. Each bucket is checked as its last chunk arrives, against the
manifest's CRC-32C. A bucket sent as a delta is first rebuilt against the
base version.

What a receiver holds while a version arrives: the version being built, the
base, and one bucket's delta at a time (a delta is applied, and dropped, as
soon as it is whole). A transfer that breaks off releases its buffers at
once. Otherwise the call's error, which holds the frame that holds the
buffers, would keep a whole version alive until the garbage collector next
ran: a cycle, found when a learner was killed during a transfer of 1.2 GB."""
import traceback

from ._stubs import weight_broadcast_pb2 as wb
from . import delta
from .crc32c import crc32c
from .errors import WeightsError


class DeltaError(WeightsError):
    """A delta that did not rebuild its version (a bucket's CRC-32C, or a
    malformed delta): the version can still be fetched whole."""


def delta_base(manifest, base):
    """`base` when `manifest`'s delta is from it (its version, incarnation and
    bucket sizes), else None."""
    if (base is None or not manifest.has_delta_base or not manifest.incarnation
            or base.version != manifest.delta_base_version
            or base.incarnation != manifest.incarnation
            or [len(b) for b in base.buckets] != [b.size_bytes for b in manifest.buckets]):
        return None
    return base


def fetch_buckets(stub, session, manifest, base, max_chunk_bytes, timeout):
    """The verified buckets of `manifest`'s version and whether any was
    rebuilt from a delta against `base` (a Snapshot, or None for the whole
    version). WeightsError (DeltaError for a delta that did not rebuild) or
    grpc.RpcError, with nothing of the version kept."""
    buckets = [None] * len(manifest.buckets)
    deltas = {}
    try:
        chunks = stub.FetchSnapshot(wb.FetchSnapshotRequest(
            session_id=session, version=manifest.version, incarnation=manifest.incarnation,
            max_chunk_bytes=max_chunk_bytes, has_base=base is not None,
            base_version=base.version if base is not None else 0), timeout=timeout)
        rebuilt = _receive(chunks, manifest, base, buckets, deltas)
    except BaseException as e:
        # The error (a gRPC call, for an RpcError) is referenced from the
        # frames its traceback holds: drop those frames' buffers now.
        buckets.clear()
        deltas.clear()
        traceback.clear_frames(e.__traceback__)
        raise
    return buckets, rebuilt


def _receive(chunks, manifest, base, buckets, deltas):
    n = len(buckets)
    filled, done, rebuilt = [0] * n, [False] * n, False
    for c in chunks:
        b = c.bucket
        if c.version != manifest.version or b >= n:
            raise WeightsError("version %d: a chunk of version %d, bucket %d does not belong"
                               % (manifest.version, c.version, b))
        if done[b]:
            raise WeightsError("version %d: a chunk of bucket %d after its last" % (manifest.version, b))
        target = _chunk_target(manifest, base, buckets, deltas, filled, c)
        data = c.data
        if c.offset != filled[b] or c.offset + len(data) > len(target):
            raise WeightsError("version %d: bucket %d chunk at %d is out of order or too long"
                               % (manifest.version, b, c.offset))
        target[c.offset:c.offset + len(data)] = data
        filled[b] += len(data)
        if filled[b] == len(target):
            rebuilt |= _finish(manifest, base, buckets, deltas, b)
            done[b] = True
    for b, info in enumerate(manifest.buckets):
        if not done[b]:
            want = len(deltas[b]) if b in deltas else info.size_bytes
            if filled[b] != want:
                raise WeightsError("version %d: bucket %d ended at %d of %d bytes"
                                   % (manifest.version, b, filled[b], want))
            if buckets[b] is None:
                buckets[b] = bytearray()  # an empty bucket: no chunk carries it
            rebuilt |= _finish(manifest, base, buckets, deltas, b)
    return rebuilt


def _chunk_target(manifest, base, buckets, deltas, filled, c):
    """Where chunk `c`'s data goes: its bucket (allocated at its first
    chunk), or the bucket's delta."""
    b = c.bucket
    size = manifest.buckets[b].size_bytes
    if not c.delta_bytes:
        if b in deltas:
            raise WeightsError("version %d: bucket %d mixes delta and whole chunks"
                               % (manifest.version, b))
        if buckets[b] is None:
            buckets[b] = bytearray(size)
        return buckets[b]
    if b not in deltas:
        if base is None or filled[b] or c.delta_bytes > delta.most_bytes(size):
            raise WeightsError("version %d: bucket %d came as a delta of %d bytes it cannot be"
                               % (manifest.version, b, c.delta_bytes))
        deltas[b] = bytearray(c.delta_bytes)
    elif len(deltas[b]) != c.delta_bytes:
        raise WeightsError("version %d: bucket %d's delta changed its length" % (manifest.version, b))
    return deltas[b]


def _finish(manifest, base, buckets, deltas, b):
    """Bucket b, whole: rebuilt from its delta when it came as one, then
    checked against its CRC-32C. Returns whether it came as a delta."""
    info = manifest.buckets[b]
    is_delta = b in deltas
    if is_delta:
        where = "version %d: bucket %d's delta against version %d" % (manifest.version, b, base.version)
        # A copy of the base (no zeroing first), rebuilt in place: on an
        # error it is dropped with the rest of the version.
        buckets[b] = bytearray(base.buckets[b])
        try:
            delta.apply(buckets[b], deltas.pop(b), buckets[b], where)
        except WeightsError as e:
            raise DeltaError(str(e)) from None
    crc = crc32c(buckets[b])
    if crc != info.crc32c:
        raise (DeltaError if is_delta else WeightsError)(
            "version %d: bucket %d%s has CRC-32C %08x, the manifest says %08x"
            % (manifest.version, b, " rebuilt from its delta" if is_delta else "", crc, info.crc32c))
    return is_delta
