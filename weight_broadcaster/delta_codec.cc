#include "weight_broadcaster/delta_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace asympo::broadcast {
namespace {

constexpr char kMagic[4] = {'A', 'S', 'D', '1'};

bool ValidWordBytes(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

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

// Calls fn(word index) for each word of `words` that differs, in order;
// compares 8 bytes at a time, then the words of a chunk that differs by
// their lanes of the XOR.
template <typename Fn>
void ForEachChanged(const uint8_t* a, const uint8_t* b, uint64_t words, int word_bytes, Fn fn) {
  const uint64_t per_chunk = 8 / static_cast<uint64_t>(word_bytes);
  const int lane_bits = 8 * word_bytes;
  const uint64_t lane = word_bytes == 8 ? ~uint64_t{0} : (uint64_t{1} << lane_bits) - 1;
  uint64_t i = 0;
  for (; i + per_chunk <= words; i += per_chunk) {
    uint64_t x, y;
    std::memcpy(&x, a + i * word_bytes, 8);
    std::memcpy(&y, b + i * word_bytes, 8);
    uint64_t d = x ^ y;
    for (uint64_t k = i; d != 0; ++k, d = word_bytes == 8 ? 0 : d >> lane_bits) {
      if ((d & lane) != 0) fn(k);
    }
  }
  for (; i < words; ++i) {
    if (std::memcmp(a + i * word_bytes, b + i * word_bytes, word_bytes) != 0) fn(i);
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
  if (h.index == DeltaIndex::kBitmap) {
    const uint64_t map = (h.words + 7) / 8;
    if (static_cast<uint64_t>(end - begin) != map + value_bytes) {
      return Bad(absl::StrCat(delta.size(), " bytes where a bitmap of ", h.words, " words and ",
                              h.changed, " values make ", kDeltaHeaderBytes + map + value_bytes));
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
    if (!GetVarint(&p, end, &gap)) return Bad(absl::StrCat("gap ", k, " is truncated"));
    if (gap >= h.words - next) return Bad(absl::StrCat("gap ", k, " names a word past the end"));
    next += gap + 1;
  }
  if (static_cast<uint64_t>(end - p) != value_bytes) {
    return Bad(absl::StrCat(end - p, " bytes of values for ", h.changed, " words of ", h.word_bytes,
                            " bytes"));
  }
  *values = p;
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeDelta(const uint8_t* base, const uint8_t* next, size_t bytes, int word_bytes,
                         std::string* delta) {
  if (!ValidWordBytes(word_bytes) || bytes % static_cast<size_t>(word_bytes) != 0) {
    return Bad(absl::StrCat("a bucket of ", bytes, " bytes in words of ", word_bytes));
  }
  const uint64_t words = bytes / static_cast<uint64_t>(word_bytes);
  uint64_t changed = 0, gap_bytes = 0, last = 0;
  ForEachChanged(base, next, words, word_bytes, [&](uint64_t i) {
    gap_bytes += VarintBytes(i - last);
    last = i + 1;
    ++changed;
  });
  const uint64_t map_bytes = (words + 7) / 8;
  const DeltaIndex kind = gap_bytes < map_bytes ? DeltaIndex::kGaps : DeltaIndex::kBitmap;
  const uint64_t index_bytes = kind == DeltaIndex::kGaps ? gap_bytes : map_bytes;
  delta->clear();
  delta->append(kMagic, 4);
  Put(static_cast<uint8_t>(word_bytes), delta);
  Put(static_cast<uint8_t>(kind), delta);
  Put(uint16_t{0}, delta);
  Put(words, delta);
  Put(changed, delta);
  delta->resize(kDeltaHeaderBytes + index_bytes + changed * static_cast<uint64_t>(word_bytes),
                '\0');
  auto* index = reinterpret_cast<uint8_t*>(delta->data()) + kDeltaHeaderBytes;
  uint8_t* values = index + index_bytes;
  uint8_t* gap = index;
  last = 0;
  ForEachChanged(base, next, words, word_bytes, [&](uint64_t i) {
    if (kind == DeltaIndex::kBitmap) {
      index[i / 8] = static_cast<uint8_t>(index[i / 8] | (1u << (i % 8)));
    } else {
      gap = PutVarint(i - last, gap);
      last = i + 1;
    }
    std::memcpy(values, next + i * word_bytes, word_bytes);
    values += word_bytes;
  });
  return absl::OkStatus();
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
  if (h->changed > h->words)
    return Bad(absl::StrCat(h->changed, " changed of ", h->words, " words"));
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
    return absl::OkStatus();
  }
  const uint8_t* p = index;
  uint64_t next = 0;
  for (uint64_t k = 0; k < h.changed; ++k) {
    uint64_t gap = 0;
    GetVarint(&p, values, &gap);  // checked above
    std::memcpy(out + (next + gap) * w, values + k * w, w);
    next += gap + 1;
  }
  return absl::OkStatus();
}

}  // namespace asympo::broadcast
