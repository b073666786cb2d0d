"""Delta versions (docs/protocol.md, "Delta versions"): a bucket sent as the
words that changed since the version the receiver holds. A delta is a run
of records, each covering the next words of the bucket:

    "ASD1" | word_bytes u8 | index kind u8 (1 bitmap, 2 gaps) | 2 zero bytes |
    words u64 | changed u64 | index_bytes u64 | index | values
    "ASD2" | word_bytes u8 (2) | index kind u8 | value coding u8 (1) | zero byte |
    words u64 | changed u64 | index_bytes u64 | value_bytes u64 | index | XOR planes

(little-endian; the bitmap has one bit per word, LSB first; gaps are LEB128
varints, the first from the record's word 0). "ASD1" carries the changed
words' new values; "ASD2" their XOR with the base: the low bytes, a bitmap
over the changed words of those whose high byte changes, those high bytes.
Needs numpy; without it a subscriber never asks for deltas."""
import struct

from .errors import WeightsError

try:
    import numpy
except ImportError:  # pragma: no cover - depends on the machine
    numpy = None

HEADER = struct.Struct("<4sBBHQQQ")      # "ASD1"
XOR_HEADER = struct.Struct("<4sBBBBQQQQ")  # "ASD2"
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
    if len(b) == changed and changed and b.max() < 0x80:
        # Every gap in one byte (the common case where many words change):
        # no varint to assemble.
        positions = numpy.cumsum(b, dtype=numpy.int64) + numpy.arange(changed, dtype=numpy.int64)
        if positions[-1] >= words:
            raise WeightsError("%s: a gap names a word past the end" % where)
        return positions
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


def _header(delta, at, where):
    """A record's (header bytes, word_bytes, index kind, XOR planes?, words,
    changed, index_bytes, value_bytes) at `at`."""
    if len(delta) - at < HEADER.size:
        raise WeightsError("%s: %d bytes without a record header" % (where, len(delta) - at))
    if bytes(delta[at:at + 4]) == b"ASD2":
        if len(delta) - at < XOR_HEADER.size:
            raise WeightsError("%s: %d bytes without a record header" % (where, len(delta) - at))
        _, word, kind, coding, zero, words, changed, index_bytes, value_bytes = XOR_HEADER.unpack_from(delta, at)
        if word != 2 or kind not in (1, 2) or coding != 1 or zero:
            raise WeightsError("%s: not an \"ASD2\" record header" % where)
        return XOR_HEADER.size, word, kind, True, words, changed, index_bytes, value_bytes
    magic, word, kind, zero, words, changed, index_bytes = HEADER.unpack_from(delta, at)
    if magic != b"ASD1" or word not in _WORD or kind not in (1, 2) or zero:
        raise WeightsError("%s: not an \"ASD1\" record header" % where)
    return HEADER.size, word, kind, False, words, changed, index_bytes, changed * word


def _xor_planes(planes, changed, where, decode):
    """An "ASD2" record's XOR words (uint16), from its planes; None without
    `decode` (then only checked)."""
    flags_at, map_bytes = changed, (changed + 7) // 8
    if len(planes) < changed + map_bytes:
        raise WeightsError("%s: %d bytes of XOR planes for %d words" % (where, len(planes), changed))
    flags = numpy.frombuffer(planes, dtype=numpy.uint8, count=map_bytes, offset=flags_at)
    highs = len(planes) - changed - map_bytes
    if (changed % 8 and flags[-1] >> (changed % 8)) or int(_BITS[flags].sum(dtype=numpy.int64)) != highs:
        raise WeightsError("%s: the high-byte bitmap does not mark %d words" % (where, highs))
    if not decode:
        return None
    x = numpy.frombuffer(planes, dtype=numpy.uint8, count=changed).astype(numpy.uint16)
    marked = numpy.flatnonzero(numpy.unpackbits(flags, bitorder="little")[:changed].view(bool))
    x[marked] |= numpy.frombuffer(planes, dtype=numpy.uint8, offset=changed + map_bytes).astype(numpy.uint16) << 8
    return x


def _record(delta, at, where, decode=True):
    """One record's (word_bytes, words, positions, values, is XOR, end) at
    `at`; positions None for a bitmap without `decode` (then only checked,
    by its bytes' bit counts), values None for XOR planes without it."""
    head, word, kind, xor, words, changed, index_bytes, value_bytes = _header(delta, at, where)
    end = at + head + index_bytes + value_bytes
    if changed > words or end > len(delta):
        raise WeightsError("%s: a record of %d bytes past the delta's end" % (where, end - at))
    index = memoryview(delta)[at + head:at + head + index_bytes]
    if kind == 1:
        if index_bytes != (words + 7) // 8:
            raise WeightsError("%s: a bitmap of %d bytes for %d words" % (where, index_bytes, words))
        raw = numpy.frombuffer(index, dtype=numpy.uint8)
        if (words % 8 and raw[-1] >> (words % 8)) or int(_BITS[raw].sum(dtype=numpy.int64)) != changed:
            raise WeightsError("%s: the bitmap does not mark %d words" % (where, changed))
        if decode:
            # As booleans: flatnonzero is about 3x faster on them than on bytes.
            positions = numpy.flatnonzero(numpy.unpackbits(raw, bitorder="little")[:words].view(bool))
        else:
            positions = None
    else:
        positions = _gaps(index, changed, words, where)
    if xor:
        values = _xor_planes(memoryview(delta)[end - value_bytes:end], changed, where, decode)
    else:
        values = numpy.frombuffer(delta, dtype=_WORD[word], count=changed, offset=at + head + index_bytes)
    return word, words, positions, values, xor, end


def _walk(delta, size, where, decode=True):
    """Yields each record's (first byte, word_bytes, positions, values, is
    XOR) in turn, checking that the records cover `size` bytes exactly."""
    covered, at = 0, 0
    while at < len(delta):
        word, words, positions, values, xor, at = _record(delta, at, where, decode)
        if covered % word or covered + words * word > size:
            raise WeightsError("%s: a record past the bucket's %d bytes" % (where, size))
        yield covered, word, positions, values, xor
        covered += words * word
    if covered != size:
        raise WeightsError("%s: records cover %d bytes of %d" % (where, covered, size))


def apply(base, delta, out, where):
    """Writes into `out` (a writable buffer as long as `base`: a bytearray,
    numpy.empty(n, uint8), which spares the zeroing, or `base` itself when
    writable, which spares the copy) the bucket that
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
    if out is not base:  # `out` may be `base` itself: rebuilt in place
        dst[:] = numpy.frombuffer(base, dtype=numpy.uint8)  # bytes, a bytearray or a numpy array alike
    for start, word, positions, values, xor in _walk(delta, len(base), where):
        words = dst[start:start + (len(dst) - start) // word * word].view(_WORD[word])
        if xor:
            words[positions] ^= values
        else:
            words[positions] = values
    return out
