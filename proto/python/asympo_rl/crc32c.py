"""CRC-32C (Castagnoli), as the learner computes it for every snapshot bucket
and the model signature. Uses Debian's python3-crc32c or python3-crcmod (C
code) when present; the pure-Python fallback is correct but slow (about
1 MB/s)."""
try:
    from crc32c import crc32c as _fast  # python3-crc32c

    def crc32c(data, crc=0):
        return _fast(data, crc)
except ImportError:  # pragma: no cover - depends on the machine
    try:
        import crcmod.predefined

        _mk = crcmod.predefined.mkCrcFun("crc-32c")

        def crc32c(data, crc=0):
            return _mk(bytes(data), crc) if crc else _mk(bytes(data))
    except ImportError:
        _TABLE = []
        for _i in range(256):
            _c = _i
            for _ in range(8):
                _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
            _TABLE.append(_c)

        def crc32c(data, crc=0):
            crc ^= 0xFFFFFFFF
            for b in bytes(data):
                crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
            return crc ^ 0xFFFFFFFF
