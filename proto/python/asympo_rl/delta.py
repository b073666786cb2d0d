"""Delta versions (docs/protocol.md, "Delta versions"): a bucket sent as the
words that changed since the version the receiver holds. A delta is a run
of records, each covering the next words of the bucket:

    "ASD1" | word_bytes u8 | index kind u8 (1 bitmap, 2 gaps) | 2 zero bytes |
    words u64 | changed u64 | index_bytes u64 | index | values

(little-endian; the bitmap has one bit per word, LSB first; gaps are LEB128
varints, the first from the record's word 0). Needs numpy; without it a
subscriber never asks for deltas."""
import struct

from .errors import WeightsError

try:
    import numpy
except ImportError:  # pragma: no cover - depends on the machine
    numpy = None

HEADER = struct.Struct("<4sBBHQQQ")
_WORD = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}
_BITS = None if numpy is None else numpy.array([bin(i).count("1") for i in range(256)], dtype=numpy.uint8)


def available():
    return numpy is not None


def most_bytes(bucket_bytes):
    """The longest delta a receiver accepts for a bucket of bucket_bytes: a
    longer one than the bucket plus a record header per MiB saves nothing."""
    return bucket_bytes + (bucket_bytes // (1 << 20) + 1) * HEADER.size


def _gaps(index, changed, words, where):
    """The changed words' positions from `changed` LEB128 gaps in `index`."""
    b = numpy.frombuffer(index, dtype=numpy.uint8)
    ends = numpy.flatnonzero(b < 0x80)
    if len(ends) != changed or (changed and ends[-1] != len(b) - 1) or (not changed and len(b)):
        raise WeightsError("%s: its index does not hold %d gaps" % (where, changed))
    if changed == 0:
        return numpy.zeros(0, dtype=numpy.int64)
    starts = numpy.concatenate(([0], ends[:-1] + 1))
    if (ends - starts).max() > 9:
        raise WeightsError("%s: a gap longer than 64 bits" % where)
    group = numpy.repeat(numpy.arange(changed), ends - starts + 1)
    shift = (numpy.arange(len(b)) - starts[group]) * 7
    gaps = numpy.add.reduceat((b & 0x7F).astype(numpy.uint64) << shift.astype(numpy.uint64), starts)
    if gaps.max() >= words:
        raise WeightsError("%s: a gap names a word past the end" % where)
    positions = numpy.cumsum(gaps.astype(numpy.int64) + 1) - 1
    if positions[-1] >= words:
        raise WeightsError("%s: a gap names a word past the end" % where)
    return positions


def _record(delta, at, where, decode=True):
    """One record's (word_bytes, words, positions, values, end) at `at`;
    positions None for a bitmap without `decode` (then only checked, by its
    bytes' bit counts)."""
    if len(delta) - at < HEADER.size:
        raise WeightsError("%s: %d bytes without a record header" % (where, len(delta) - at))
    magic, word, kind, zero, words, changed, index_bytes = HEADER.unpack_from(delta, at)
    if magic != b"ASD1" or word not in _WORD or kind not in (1, 2) or zero:
        raise WeightsError("%s: not an \"ASD1\" record header" % where)
    end = at + HEADER.size + index_bytes + changed * word
    if changed > words or end > len(delta):
        raise WeightsError("%s: a record of %d bytes past the delta's end" % (where, end - at))
    index = memoryview(delta)[at + HEADER.size:at + HEADER.size + index_bytes]
    if kind == 1:
        if index_bytes != (words + 7) // 8:
            raise WeightsError("%s: a bitmap of %d bytes for %d words" % (where, index_bytes, words))
        raw = numpy.frombuffer(index, dtype=numpy.uint8)
        if (words % 8 and raw[-1] >> (words % 8)) or int(_BITS[raw].sum(dtype=numpy.int64)) != changed:
            raise WeightsError("%s: the bitmap does not mark %d words" % (where, changed))
        if decode:
            positions = numpy.flatnonzero(numpy.unpackbits(raw, bitorder="little")[:words])
        else:
            positions = None
    else:
        positions = _gaps(index, changed, words, where)
    values = numpy.frombuffer(delta, dtype=_WORD[word], count=changed,
                              offset=at + HEADER.size + index_bytes)
    return word, words, positions, values, end


def _walk(delta, size, where, decode=True):
    """Yields each record's (first byte, word_bytes, positions, values) in
    turn, checking that the records cover `size` bytes exactly."""
    covered, at = 0, 0
    while at < len(delta):
        word, words, positions, values, at = _record(delta, at, where, decode)
        if covered % word or covered + words * word > size:
            raise WeightsError("%s: a record past the bucket's %d bytes" % (where, size))
        yield covered, word, positions, values
        covered += words * word
    if covered != size:
        raise WeightsError("%s: records cover %d bytes of %d" % (where, covered, size))


def apply(base, delta, out, where):
    """Writes into `out` (a writable buffer as long as `base`: a bytearray,
    or numpy.empty(n, uint8), which spares the zeroing) the bucket that
    `delta` makes of `base`, and returns it. WeightsError naming `where`
    for a delta that does not fit, with `out` untouched.

    Two passes over the records, one record's index decoded at a time (a
    record covers 1 MiB of the bucket as the learner encodes it): the first
    checks every record, the second writes. Decoding twice costs less than
    holding every changed word's position at once, 8 bytes a word, which
    for a bucket of a few hundred MB is as much again as the bucket."""
    if len(out) != len(base):
        raise WeightsError("%s: %d bytes to write for a bucket of %d" % (where, len(out), len(base)))
    for _ in _walk(delta, len(base), where, decode=False):
        pass
    dst = numpy.frombuffer(out, dtype=numpy.uint8)
    dst[:] = numpy.frombuffer(base, dtype=numpy.uint8)  # bytes, a bytearray or a numpy array alike
    for start, word, positions, values in _walk(delta, len(base), where):
        dst[start:start + (len(dst) - start) // word * word].view(_WORD[word])[positions] = values
    return out
