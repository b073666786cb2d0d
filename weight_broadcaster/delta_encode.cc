// The delta encoder (delta_codec.h): one vectorised pass over a record's
// words collects both indexes and both value codings, then keeps the
// smaller of each.
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/parallel_runs.h"
#include "weight_broadcaster/delta_codec.h"
#include "weight_broadcaster/delta_format.h"

namespace asympo::broadcast {
namespace {

// Writes `v` at `out`; returns the byte after it.
uint8_t* PutVarint(uint64_t v, uint8_t* out) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

template <typename T>
void Put(T v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// One pass over a record's words: the gaps index (LEB128), the bitmap and
// the changed words' values, all at once; the encoder then keeps the
// smaller index. For 2-byte words also the XOR planes ("ASD2"): the low
// bytes, the bitmap of high bytes that change, and those high bytes.
struct Scan {
  std::string gaps, values, bitmap;
  std::string lows, flags, highs;
  bool planes = false;
  uint64_t changed = 0;
  uint64_t last = 0;  // the word after the last changed one
  char* gap = nullptr;
  char* value = nullptr;
  char* low = nullptr;
  char* high = nullptr;

  void Reset(uint64_t words, int w) {
    changed = last = 0;
    planes = w == 2;
    bitmap.assign((words + 7) / 8, '\0');
    // Grown as needed (Reserve): a record's gaps are small when few words
    // changed, and no more than 10 bytes each.
    gaps.resize(std::max<size_t>(gaps.size(), 1024));
    values.resize(std::max<size_t>(values.size(), 1024));
    gap = gaps.data();
    value = values.data();
    if (planes) {
      flags.assign((words + 7) / 8, '\0');  // at most one bit a word
      lows.resize(std::max<size_t>(lows.size(), 1024));
      highs.resize(std::max<size_t>(highs.size(), 1024));
      low = lows.data();
      high = highs.data();
    }
  }
  // Room for `n` more changed words of `w` bytes.
  void Reserve(uint64_t n, int w) {
    const size_t g = static_cast<size_t>(gap - gaps.data());
    const size_t v = static_cast<size_t>(value - values.data());
    if (g + n * 10 > gaps.size()) gaps.resize(std::max(2 * gaps.size(), g + n * 10));
    if (v + n * w > values.size()) values.resize(std::max(2 * values.size(), v + n * w));
    gap = gaps.data() + g;
    value = values.data() + v;
    if (planes) {
      const size_t l = static_cast<size_t>(low - lows.data());
      const size_t h = static_cast<size_t>(high - highs.data());
      if (l + n > lows.size()) lows.resize(std::max(2 * lows.size(), l + n));
      if (h + n > highs.size()) highs.resize(std::max(2 * highs.size(), h + n));
      low = lows.data() + l;
      high = highs.data() + h;
    }
  }
  // Changed word i of `next` (against `base`): its gap and its value, and
  // its XOR planes (room reserved).
  void Push(uint64_t i, const uint8_t* base, const uint8_t* next, int w) {
    gap = reinterpret_cast<char*>(PutVarint(i - last, reinterpret_cast<uint8_t*>(gap)));
    std::memcpy(value, next + i * static_cast<uint64_t>(w), static_cast<size_t>(w));
    value += w;
    if (planes) {
      const uint8_t lo = base[2 * i] ^ next[2 * i];
      const uint8_t hi = base[2 * i + 1] ^ next[2 * i + 1];
      *low++ = static_cast<char>(lo);
      if (hi != 0) {
        *high++ = static_cast<char>(hi);
        flags[changed / 8] = static_cast<char>(flags[changed / 8] | (1u << (changed % 8)));
      }
    }
    last = i + 1;
    ++changed;
  }
  void Add(uint64_t i, const uint8_t* base, const uint8_t* next, int w) {
    Reserve(1, w);
    Push(i, base, next, w);
    bitmap[i / 8] = static_cast<char>(bitmap[i / 8] | (1u << (i % 8)));
  }
  // Words first .. first + 16 (or 8) of `mask` (bit k: word first + k
  // changed), whose bitmap byte(s) are written whole.
  void AddMask(uint64_t first, uint32_t mask, int mask_bits, const uint8_t* base,
               const uint8_t* next, int w) {
    Reserve(static_cast<uint64_t>(mask_bits), w);
    std::memcpy(bitmap.data() + first / 8, &mask, static_cast<size_t>(mask_bits / 8));
    for (uint32_t m = mask; m != 0; m &= m - 1) {
      Push(first + static_cast<uint64_t>(__builtin_ctz(m)), base, next, w);
    }
  }
  size_t gap_bytes() const { return static_cast<size_t>(gap - gaps.data()); }
  size_t high_bytes() const { return static_cast<size_t>(high - highs.data()); }
  // The XOR planes' bytes: low bytes, the high-byte bitmap, the high bytes.
  uint64_t plane_bytes() const { return changed + (changed + 7) / 8 + high_bytes(); }
};

#if defined(__SSE2__)
// The words of one 32-byte block of 2- or 4-byte words (16 or 8) that
// differ between a and b, bit k for word k: compares packed to one byte a
// word.
uint32_t ChangedMask(const uint8_t* a, const uint8_t* b, int w) {
  const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16));
  const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16));
  if (w == 2) {
    const __m128i eq = _mm_packs_epi16(_mm_cmpeq_epi16(a0, b0), _mm_cmpeq_epi16(a1, b1));
    return ~static_cast<uint32_t>(_mm_movemask_epi8(eq)) & 0xFFFFu;
  }
  const __m128i eq16 = _mm_packs_epi32(_mm_cmpeq_epi32(a0, b0), _mm_cmpeq_epi32(a1, b1));
  const __m128i eq = _mm_packs_epi16(eq16, _mm_setzero_si128());
  return ~static_cast<uint32_t>(_mm_movemask_epi8(eq)) & 0xFFu;
}

// The words that whole 32-byte blocks hold, which ChangedMask compares: all
// of them but a last partial block for 2- and 4-byte words, none for others.
uint64_t BlockWords(uint64_t words, int w) {
  if (w != 2 && w != 4) return 0;
  const uint64_t per_block = 32 / static_cast<uint64_t>(w);
  return words / per_block * per_block;
}
#endif

// Scans `words` words of a and b into `s`: 32 bytes at a time
// (ChangedMask), word by word after the last whole block.
void ScanChanged(const uint8_t* a, const uint8_t* b, uint64_t words, int w, Scan* s) {
  s->Reset(words, w);
  uint64_t i = 0;
#if defined(__SSE2__)
  const uint64_t blocked = BlockWords(words, w);
  const uint64_t per_block = 32 / static_cast<uint64_t>(w);
  for (; i < blocked; i += per_block) {
    const uint64_t at = i * static_cast<uint64_t>(w);
    const uint32_t mask = ChangedMask(a + at, b + at, w);
    if (mask != 0) s->AddMask(i, mask, static_cast<int>(per_block), a, b, w);
  }
#endif
  for (; i < words; ++i) {
    const uint64_t at = i * static_cast<uint64_t>(w);
    if (std::memcmp(a + at, b + at, static_cast<size_t>(w)) != 0) s->Add(i, a, b, w);
  }
}

}  // namespace

absl::Status EncodeDelta(const uint8_t* base, const uint8_t* next, size_t bytes, int word_bytes,
                         std::string* delta) {
  if (!ValidDeltaWordBytes(word_bytes) || bytes % static_cast<size_t>(word_bytes) != 0) {
    return DeltaError(absl::StrCat("a bucket of ", bytes, " bytes in words of ", word_bytes));
  }
  const uint64_t words = bytes / static_cast<uint64_t>(word_bytes);
  thread_local Scan scan;  // reused: no allocation per record
  ScanChanged(base, next, words, word_bytes, &scan);
  const uint64_t changed = scan.changed;
  const uint64_t map_bytes = (words + 7) / 8;
  const uint64_t gap_bytes = scan.gap_bytes();
  const DeltaIndex kind = gap_bytes < map_bytes ? DeltaIndex::kGaps : DeltaIndex::kBitmap;
  const uint64_t index_bytes = kind == DeltaIndex::kGaps ? gap_bytes : map_bytes;
  const uint64_t whole_bytes = changed * static_cast<uint64_t>(word_bytes);
  // The XOR planes when they are smaller, their longer header included.
  const bool planes =
      scan.planes && scan.plane_bytes() + (kDeltaXorHeaderBytes - kDeltaHeaderBytes) < whole_bytes;
  const uint64_t value_bytes = planes ? scan.plane_bytes() : whole_bytes;
  delta->clear();
  delta->reserve((planes ? kDeltaXorHeaderBytes : kDeltaHeaderBytes) + index_bytes + value_bytes);
  delta->append(planes ? kDeltaXorMagic : kDeltaMagic, 4);
  Put(static_cast<uint8_t>(word_bytes), delta);
  Put(static_cast<uint8_t>(kind), delta);
  Put(static_cast<uint8_t>(planes ? DeltaValues::kXorPlanes : DeltaValues::kWhole), delta);
  Put(uint8_t{0}, delta);
  Put(words, delta);
  Put(changed, delta);
  Put(index_bytes, delta);
  if (planes) Put(value_bytes, delta);
  delta->append(kind == DeltaIndex::kGaps ? scan.gaps.data() : scan.bitmap.data(), index_bytes);
  if (planes) {
    delta->append(scan.lows.data(), changed);
    delta->append(scan.flags.data(), (changed + 7) / 8);
    delta->append(scan.highs.data(), scan.high_bytes());
  } else {
    delta->append(scan.values.data(), value_bytes);
  }
  if (scan.gaps.size() > (size_t{1} << 24) || scan.values.size() > (size_t{1} << 24) ||
      scan.lows.size() > (size_t{1} << 24)) {
    scan = Scan();
  }
  return absl::OkStatus();
}

uint64_t CountChangedWords(const uint8_t* a, const uint8_t* b, size_t bytes, int word_bytes) {
  const uint64_t w = static_cast<uint64_t>(word_bytes);
  const uint64_t words = bytes / w;
  uint64_t changed = 0, i = 0;
#if defined(__SSE2__)
  const uint64_t blocked = BlockWords(words, word_bytes);
  for (; i < blocked; i += 32 / w) {
    changed +=
        static_cast<uint64_t>(__builtin_popcount(ChangedMask(a + i * w, b + i * w, word_bytes)));
  }
#endif
  for (; i < words; ++i) changed += std::memcmp(a + i * w, b + i * w, w) != 0 ? 1 : 0;
  return changed;
}

absl::Status EncodeDeltaPieces(const uint8_t* base, const uint8_t* next, size_t bytes,
                               int word_bytes, size_t piece_bytes, int threads, std::string* delta,
                               uint32_t* next_crc) {
  if (!ValidDeltaWordBytes(word_bytes) || bytes % static_cast<size_t>(word_bytes) != 0 ||
      piece_bytes == 0 || piece_bytes % static_cast<size_t>(word_bytes) != 0) {
    return DeltaError(absl::StrCat("a bucket of ", bytes, " bytes in words of ", word_bytes,
                                   " and pieces of ", piece_bytes));
  }
  const size_t pieces = std::max<size_t>(1, (bytes + piece_bytes - 1) / piece_bytes);
  std::vector<std::string> records(pieces);
  std::vector<absl::Status> status(pieces);
  std::vector<uint32_t> crcs(pieces, 0);
  ParallelRuns(pieces, threads, [&](size_t i) {
    const size_t off = i * piece_bytes;
    const size_t n = std::min(piece_bytes, bytes - std::min(bytes, off));
    status[i] = EncodeDelta(base + off, next + off, n, word_bytes, &records[i]);
    if (next_crc != nullptr) crcs[i] = Crc32c(next + off, n);  // just read: in cache
  });
  if (next_crc != nullptr) {
    uint32_t all = 0;
    for (size_t i = 0; i < pieces; ++i) {
      const size_t off = i * piece_bytes;
      all = i == 0 ? crcs[0] : Crc32cCombine(all, crcs[i], std::min(piece_bytes, bytes - off));
    }
    *next_crc = all;
  }
  size_t total = 0;
  for (size_t i = 0; i < pieces; ++i) {
    if (!status[i].ok()) return status[i];
    total += records[i].size();
  }
  delta->clear();
  delta->reserve(total);
  for (const std::string& r : records) delta->append(r);
  return absl::OkStatus();
}

}  // namespace asympo::broadcast
