#include "common/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "common/parallel_runs.h"

namespace asympo {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

// Slicing-by-8 over the raw (non-inverted) register.
uint32_t SoftwareUpdate(uint32_t c, const uint8_t* p, size_t n) {
  static const Tables* tables = new Tables();
  const auto& t = tables->t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

// --- Shifting a register over zero bytes (GF(2) linear maps) -----------------
//
// The raw register after `n` zero bytes is a linear function of the register
// before them: a 32x32 matrix over GF(2), kept as its 32 columns (the image
// of each single bit).
using Matrix = std::array<uint32_t, 32>;

uint32_t Apply(const Matrix& m, uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1) out ^= m[i];
  }
  return out;
}

Matrix Compose(const Matrix& a, const Matrix& b) {  // a after b
  Matrix out;
  for (int i = 0; i < 32; ++i) out[i] = Apply(a, b[i]);
  return out;
}

// The map of one zero byte, squared again and again: kZeroPowers[k] shifts
// over 2^k zero bytes.
struct ZeroPowers {
  std::array<Matrix, 64> m;
  ZeroPowers() {
    Matrix bit;  // one zero bit
    bit[0] = kPolyReflected;
    for (int i = 1; i < 32; ++i) bit[i] = 1u << (i - 1);
    Matrix byte = bit;
    for (int i = 0; i < 3; ++i) byte = Compose(byte, byte);  // 8 bits
    m[0] = byte;
    for (int k = 1; k < 64; ++k) m[k] = Compose(m[k - 1], m[k - 1]);
  }
};

uint32_t ShiftOverZeros(uint32_t c, uint64_t n) {
  static const ZeroPowers* powers = new ZeroPowers();
  for (int k = 0; n != 0; ++k, n >>= 1) {
    if (n & 1) c = Apply(powers->m[k], c);
  }
  return c;
}

// A fixed shift as four byte tables (4 lookups instead of up to 32 XORs).
struct ByteShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  explicit ByteShift(uint64_t n) {
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) t[k][v] = ShiftOverZeros(v << (8 * k), n);
    }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t OneStream(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// The crc32 instruction takes 3 cycles and starts one a cycle: three
// independent streams over three neighbouring blocks keep it busy, and the
// blocks' registers are joined by shifting (ByteShift) and XOR.
constexpr size_t kBlock = 8192;

__attribute__((target("sse4.2"))) uint32_t HardwareUpdate(uint32_t c, const uint8_t* p, size_t n) {
  static const ByteShift* shift1 = new ByteShift(kBlock);
  static const ByteShift* shift2 = new ByteShift(2 * kBlock);
  while (n >= 3 * kBlock) {
    uint64_t a = c, b = 0, d = 0;
    const uint8_t* pb = p + kBlock;
    const uint8_t* pd = p + 2 * kBlock;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, pb + i, 8);
      std::memcpy(&wd, pd + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      d = _mm_crc32_u64(d, wd);
    }
    c = (*shift2)(static_cast<uint32_t>(a)) ^ (*shift1)(static_cast<uint32_t>(b)) ^
        static_cast<uint32_t>(d);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  return OneStream(c, p, n);
}
#endif

bool DetectHardware() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t RawUpdate(uint32_t c, const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (Crc32cIsHardwareAccelerated()) return HardwareUpdate(c, p, n);
#endif
  return SoftwareUpdate(c, p, n);
}

}  // namespace

bool Crc32cIsHardwareAccelerated() {
  static const bool hw = DetectHardware();
  return hw;
}

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  return ~SoftwareUpdate(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  return ~RawUpdate(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cOneStream(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (Crc32cIsHardwareAccelerated()) return ~OneStream(~crc, p, n);
#endif
  return ~SoftwareUpdate(~crc, p, n);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // With the inversions: crc(A B) = shift(crc(A) ^ crc(zeros), |B|) ^ crc(B)
  // in raw registers, which comes to shifting crc(A) and XOR.
  return ShiftOverZeros(crc_a, len_b) ^ crc_b;
}

std::vector<uint32_t> Crc32cOfMany(const std::vector<Crc32cSpan>& spans, int threads) {
  std::vector<uint32_t> out(spans.size(), 0);
  // Pieces of at most kPiece bytes, spread over the threads; each span's
  // pieces are joined in order afterwards.
  constexpr size_t kPiece = size_t{32} << 20;
  struct Piece {
    size_t span;
    size_t offset, size;
    uint32_t crc = 0;
  };
  std::vector<Piece> pieces;
  for (size_t s = 0; s < spans.size(); ++s) {
    const size_t n = spans[s].size;
    for (size_t off = 0; off < n; off += kPiece)
      pieces.push_back({s, off, std::min(kPiece, n - off)});
  }
  ParallelRuns(pieces.size(), threads, [&](size_t i) {
    Piece& piece = pieces[i];
    piece.crc =
        Crc32c(static_cast<const uint8_t*>(spans[piece.span].data) + piece.offset, piece.size);
  });
  for (const Piece& piece : pieces) {
    out[piece.span] =
        piece.offset == 0 ? piece.crc : Crc32cCombine(out[piece.span], piece.crc, piece.size);
  }
  return out;
}

}  // namespace asympo
