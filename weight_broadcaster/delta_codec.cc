#include "weight_broadcaster/delta_codec.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/parallel_runs.h"

namespace asympo::broadcast {
namespace {

constexpr char kMagic[4] = {'A', 'S', 'D', '1'};

bool ValidWordBytes(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

// Writes `v` at `out`; returns the byte after it.
uint8_t* PutVarint(uint64_t v, uint8_t* out) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

// Reads one varint at `*p` (below `end`); false when it is truncated or
// longer than 64 bits.
bool GetVarint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    const uint8_t byte = *(*p)++;
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) {
      *v = value;
      return true;
    }
  }
  return false;
}

template <typename T>
void Put(T v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// One pass over a record's words: the gaps index (LEB128), the bitmap and
// the changed words' values, all at once; the encoder then keeps the
// smaller index.
struct Scan {
  std::string gaps, values, bitmap;
  uint64_t changed = 0;
  uint64_t last = 0;  // the word after the last changed one
  char* gap = nullptr;
  char* value = nullptr;

  void Reset(uint64_t words) {
    changed = last = 0;
    bitmap.assign((words + 7) / 8, '\0');
    // Grown as needed (Reserve): a record's gaps are small when few words
    // changed, and no more than 10 bytes each.
    gaps.resize(std::max<size_t>(gaps.size(), 1024));
    values.resize(std::max<size_t>(values.size(), 1024));
    gap = gaps.data();
    value = values.data();
  }
  // Room for `n` more changed words of `w` bytes.
  void Reserve(uint64_t n, int w) {
    const size_t g = static_cast<size_t>(gap - gaps.data());
    const size_t v = static_cast<size_t>(value - values.data());
    if (g + n * 10 > gaps.size()) gaps.resize(std::max(2 * gaps.size(), g + n * 10));
    if (v + n * w > values.size()) values.resize(std::max(2 * values.size(), v + n * w));
    gap = gaps.data() + g;
    value = values.data() + v;
  }
  // Changed word i of `next`: its gap and its value (room reserved).
  void Push(uint64_t i, const uint8_t* next, int w) {
    gap = reinterpret_cast<char*>(PutVarint(i - last, reinterpret_cast<uint8_t*>(gap)));
    std::memcpy(value, next + i * static_cast<uint64_t>(w), static_cast<size_t>(w));
    value += w;
    last = i + 1;
    ++changed;
  }
  void Add(uint64_t i, const uint8_t* next, int w) {
    Reserve(1, w);
    Push(i, next, w);
    bitmap[i / 8] = static_cast<char>(bitmap[i / 8] | (1u << (i % 8)));
  }
  // Words first .. first + 16 (or 8) of `mask` (bit k: word first + k
  // changed), whose bitmap byte(s) are written whole.
  void AddMask(uint64_t first, uint32_t mask, int mask_bits, const uint8_t* next, int w) {
    Reserve(static_cast<uint64_t>(mask_bits), w);
    std::memcpy(bitmap.data() + first / 8, &mask, static_cast<size_t>(mask_bits / 8));
    for (uint32_t m = mask; m != 0; m &= m - 1) {
      Push(first + static_cast<uint64_t>(__builtin_ctz(m)), next, w);
    }
  }
  size_t gap_bytes() const { return static_cast<size_t>(gap - gaps.data()); }
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
  s->Reset(words);
  uint64_t i = 0;
#if defined(__SSE2__)
  const uint64_t blocked = BlockWords(words, w);
  const uint64_t per_block = 32 / static_cast<uint64_t>(w);
  for (; i < blocked; i += per_block) {
    const uint64_t at = i * static_cast<uint64_t>(w);
    const uint32_t mask = ChangedMask(a + at, b + at, w);
    if (mask != 0) s->AddMask(i, mask, static_cast<int>(per_block), b, w);
  }
#endif
  for (; i < words; ++i) {
    const uint64_t at = i * static_cast<uint64_t>(w);
    if (std::memcmp(a + at, b + at, static_cast<size_t>(w)) != 0) s->Add(i, b, w);
  }
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("delta: ", what));
}

// Checks the index against the header and the delta's length; `values` is
// where the changed words' values begin.
absl::Status CheckIndex(const DeltaHeader& h, absl::string_view delta, const uint8_t** values) {
  const auto* begin = reinterpret_cast<const uint8_t*>(delta.data()) + kDeltaHeaderBytes;
  const auto* end = reinterpret_cast<const uint8_t*>(delta.data()) + delta.size();
  const uint64_t value_bytes = h.changed * static_cast<uint64_t>(h.word_bytes);
  if (static_cast<uint64_t>(end - begin) != h.index_bytes + value_bytes) {
    return Bad(absl::StrCat(delta.size(), " bytes where its header makes ", h.record_bytes()));
  }
  if (h.index == DeltaIndex::kBitmap) {
    const uint64_t map = (h.words + 7) / 8;
    if (h.index_bytes != map) {
      return Bad(absl::StrCat("a bitmap of ", h.index_bytes, " bytes for ", h.words, " words"));
    }
    uint64_t set = 0;
    for (uint64_t i = 0; i < map; ++i) set += static_cast<uint64_t>(__builtin_popcount(begin[i]));
    if (set != h.changed)
      return Bad(absl::StrCat("the bitmap marks ", set, " words, the header ", h.changed));
    if (h.words % 8 != 0 && (begin[map - 1] >> (h.words % 8)) != 0) {
      return Bad("the bitmap marks words past the end");
    }
    *values = begin + map;
    return absl::OkStatus();
  }
  const uint8_t* p = begin;
  uint64_t next = 0;  // the first word the next gap may name
  for (uint64_t k = 0; k < h.changed; ++k) {
    uint64_t gap = 0;
    if (!GetVarint(&p, begin + h.index_bytes, &gap)) {
      return Bad(absl::StrCat("gap ", k, " is truncated"));
    }
    if (gap >= h.words - next) return Bad(absl::StrCat("gap ", k, " names a word past the end"));
    next += gap + 1;
  }
  if (p != begin + h.index_bytes) {
    return Bad(absl::StrCat(p - begin, " bytes of gaps where the header says ", h.index_bytes));
  }
  *values = p;
  return absl::OkStatus();
}

// Writes the bucket a checked record (its header `h`, its values at
// `values`) makes of `base` into `out`.
void ApplyRecord(const DeltaHeader& h, absl::string_view delta, const uint8_t* values,
                 const uint8_t* base, uint8_t* out) {
  const size_t bytes = static_cast<size_t>(h.words) * static_cast<size_t>(h.word_bytes);
  if (out != base) std::memcpy(out, base, bytes);
  const auto* index = reinterpret_cast<const uint8_t*>(delta.data()) + kDeltaHeaderBytes;
  const size_t w = static_cast<size_t>(h.word_bytes);
  if (h.index == DeltaIndex::kBitmap) {
    for (uint64_t byte = 0, k = 0; byte < (h.words + 7) / 8; ++byte) {
      for (uint8_t bits = index[byte]; bits != 0; bits &= static_cast<uint8_t>(bits - 1)) {
        const uint64_t i = byte * 8 + static_cast<uint64_t>(__builtin_ctz(bits));
        std::memcpy(out + i * w, values + (k++) * w, w);
      }
    }
    return;
  }
  const uint8_t* p = index;
  uint64_t next = 0;
  for (uint64_t k = 0; k < h.changed; ++k) {
    uint64_t gap = 0;
    GetVarint(&p, values, &gap);  // checked above
    std::memcpy(out + (next + gap) * w, values + k * w, w);
    next += gap + 1;
  }
}

}  // namespace

absl::Status EncodeDelta(const uint8_t* base, const uint8_t* next, size_t bytes, int word_bytes,
                         std::string* delta) {
  if (!ValidWordBytes(word_bytes) || bytes % static_cast<size_t>(word_bytes) != 0) {
    return Bad(absl::StrCat("a bucket of ", bytes, " bytes in words of ", word_bytes));
  }
  const uint64_t words = bytes / static_cast<uint64_t>(word_bytes);
  thread_local Scan scan;  // reused: no allocation per record
  ScanChanged(base, next, words, word_bytes, &scan);
  const uint64_t changed = scan.changed;
  const uint64_t map_bytes = (words + 7) / 8;
  const uint64_t gap_bytes = scan.gap_bytes();
  const DeltaIndex kind = gap_bytes < map_bytes ? DeltaIndex::kGaps : DeltaIndex::kBitmap;
  const uint64_t index_bytes = kind == DeltaIndex::kGaps ? gap_bytes : map_bytes;
  const uint64_t value_bytes = changed * static_cast<uint64_t>(word_bytes);
  delta->clear();
  delta->reserve(kDeltaHeaderBytes + index_bytes + value_bytes);
  delta->append(kMagic, 4);
  Put(static_cast<uint8_t>(word_bytes), delta);
  Put(static_cast<uint8_t>(kind), delta);
  Put(uint16_t{0}, delta);
  Put(words, delta);
  Put(changed, delta);
  Put(index_bytes, delta);
  delta->append(kind == DeltaIndex::kGaps ? scan.gaps.data() : scan.bitmap.data(), index_bytes);
  delta->append(scan.values.data(), value_bytes);
  if (scan.gaps.size() > (size_t{1} << 24) || scan.values.size() > (size_t{1} << 24)) scan = Scan();
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

absl::Status ReadDeltaHeader(absl::string_view delta, DeltaHeader* h) {
  if (delta.size() < kDeltaHeaderBytes || std::memcmp(delta.data(), kMagic, 4) != 0) {
    return Bad(absl::StrCat(delta.size(), " bytes without its \"ASD1\" header"));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(delta.data());
  h->word_bytes = p[4];
  if (!ValidWordBytes(h->word_bytes)) return Bad(absl::StrCat("word_bytes ", h->word_bytes));
  if (p[5] != static_cast<uint8_t>(DeltaIndex::kBitmap) &&
      p[5] != static_cast<uint8_t>(DeltaIndex::kGaps)) {
    return Bad(absl::StrCat("unknown index kind ", int{p[5]}));
  }
  if (p[6] != 0 || p[7] != 0) return Bad("reserved header bytes are not zero");
  h->index = static_cast<DeltaIndex>(p[5]);
  std::memcpy(&h->words, p + 8, 8);
  std::memcpy(&h->changed, p + 16, 8);
  std::memcpy(&h->index_bytes, p + 24, 8);
  if (h->changed > h->words)
    return Bad(absl::StrCat(h->changed, " changed of ", h->words, " words"));
  // Bounds every length below 2^63, so record_bytes() cannot wrap.
  if (h->words > (uint64_t{1} << 56) || h->index_bytes > (uint64_t{1} << 60)) {
    return Bad(absl::StrCat("a record of ", h->words, " words and an index of ", h->index_bytes,
                            " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ApplyDelta(const uint8_t* base, absl::string_view delta, uint8_t* out, size_t bytes) {
  DeltaHeader h;
  if (absl::Status s = ReadDeltaHeader(delta, &h); !s.ok()) return s;
  if (h.words > bytes / static_cast<uint64_t>(h.word_bytes) ||
      h.words * static_cast<uint64_t>(h.word_bytes) != bytes) {
    return Bad(absl::StrCat(h.words, " words of ", h.word_bytes, " bytes for a bucket of ", bytes));
  }
  const uint8_t* values = nullptr;
  if (absl::Status s = CheckIndex(h, delta, &values); !s.ok()) return s;
  ApplyRecord(h, delta, values, base, out);
  return absl::OkStatus();
}

absl::Status EncodeDeltaPieces(const uint8_t* base, const uint8_t* next, size_t bytes,
                               int word_bytes, size_t piece_bytes, int threads, std::string* delta,
                               uint32_t* next_crc) {
  if (!ValidWordBytes(word_bytes) || bytes % static_cast<size_t>(word_bytes) != 0 ||
      piece_bytes == 0 || piece_bytes % static_cast<size_t>(word_bytes) != 0) {
    return Bad(absl::StrCat("a bucket of ", bytes, " bytes in words of ", word_bytes,
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

absl::Status ApplyDeltaPieces(const uint8_t* base, absl::string_view delta, uint8_t* out,
                              size_t bytes, int threads, uint32_t* crc) {
  struct Record {
    absl::string_view bytes;
    size_t offset = 0, size = 0;
    DeltaHeader header;
    const uint8_t* values = nullptr;
    uint32_t crc = 0;
  };
  std::vector<Record> records;
  size_t covered = 0;
  for (absl::string_view rest = delta; !rest.empty();) {
    DeltaHeader h;
    if (absl::Status s = ReadDeltaHeader(rest, &h); !s.ok()) {
      return Bad(absl::StrCat("record ", records.size(), ": ", s.message()));
    }
    const uint64_t piece = h.words * static_cast<uint64_t>(h.word_bytes);
    if (h.record_bytes() > rest.size() || piece > bytes - covered) {
      return Bad(absl::StrCat("record ", records.size(), " of ", h.record_bytes(), " bytes for ",
                              piece, " bytes at ", covered, ": past the end of the delta (",
                              rest.size(), " bytes left) or of the bucket (", bytes, ")"));
    }
    Record r;
    r.bytes = rest.substr(0, h.record_bytes());
    r.offset = covered;
    r.size = static_cast<size_t>(piece);
    records.push_back(r);
    covered += piece;
    rest.remove_prefix(h.record_bytes());
  }
  if (covered != bytes) {
    return Bad(absl::StrCat("records cover ", covered, " bytes of a bucket of ", bytes));
  }
  // Checked whole before any byte of `out` is written.
  for (size_t i = 0; i < records.size(); ++i) {
    Record& r = records[i];
    ReadDeltaHeader(r.bytes, &r.header).IgnoreError();  // read above
    if (absl::Status s = CheckIndex(r.header, r.bytes, &r.values); !s.ok()) {
      return Bad(absl::StrCat("record ", i, ": ", s.message()));
    }
  }
  ParallelRuns(records.size(), threads, [&](size_t i) {
    Record& r = records[i];
    ApplyRecord(r.header, r.bytes, r.values, base + r.offset, out + r.offset);
    r.crc = Crc32c(out + r.offset, r.size);
  });
  uint32_t all = 0;
  for (const Record& r : records) all = r.offset == 0 ? r.crc : Crc32cCombine(all, r.crc, r.size);
  *crc = all;
  return absl::OkStatus();
}

}  // namespace asympo::broadcast
