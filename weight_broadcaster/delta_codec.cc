#include "weight_broadcaster/delta_codec.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/parallel_runs.h"
#include "weight_broadcaster/delta_format.h"

namespace asympo::broadcast {
namespace {

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

// Checks an "ASD2" record's XOR planes (`value_bytes` at `values`): the
// high-byte bitmap marks no word past `changed`, and as many as there are
// high bytes.
absl::Status CheckPlanes(const DeltaHeader& h, const uint8_t* values) {
  if (h.values != DeltaValues::kXorPlanes) return absl::OkStatus();
  const uint64_t map = (h.changed + 7) / 8;
  if (h.value_bytes < h.changed + map) {
    return DeltaError(
        absl::StrCat(h.value_bytes, " bytes of XOR planes for ", h.changed, " words"));
  }
  const uint8_t* flags = values + h.changed;
  uint64_t set = 0;
  for (uint64_t i = 0; i < map; ++i) set += static_cast<uint64_t>(__builtin_popcount(flags[i]));
  if (h.changed % 8 != 0 && (flags[map - 1] >> (h.changed % 8)) != 0) {
    return DeltaError("the high-byte bitmap marks words past the changed ones");
  }
  if (set != h.value_bytes - h.changed - map) {
    return DeltaError(absl::StrCat("the high-byte bitmap marks ", set, " words for ",
                                   h.value_bytes - h.changed - map, " high bytes"));
  }
  return absl::OkStatus();
}

// Checks the index against the header and the delta's length; `values` is
// where the changed words' values begin.
absl::Status CheckIndex(const DeltaHeader& h, absl::string_view delta, const uint8_t** values) {
  const auto* begin = reinterpret_cast<const uint8_t*>(delta.data()) + h.header_bytes();
  const auto* end = reinterpret_cast<const uint8_t*>(delta.data()) + delta.size();
  if (static_cast<uint64_t>(end - begin) != h.index_bytes + h.value_bytes) {
    return DeltaError(
        absl::StrCat(delta.size(), " bytes where its header makes ", h.record_bytes()));
  }
  if (absl::Status s = CheckPlanes(h, end - h.value_bytes); !s.ok()) return s;
  if (h.index == DeltaIndex::kBitmap) {
    const uint64_t map = (h.words + 7) / 8;
    if (h.index_bytes != map) {
      return DeltaError(
          absl::StrCat("a bitmap of ", h.index_bytes, " bytes for ", h.words, " words"));
    }
    uint64_t set = 0;
    for (uint64_t i = 0; i < map; ++i) set += static_cast<uint64_t>(__builtin_popcount(begin[i]));
    if (set != h.changed)
      return DeltaError(absl::StrCat("the bitmap marks ", set, " words, the header ", h.changed));
    if (h.words % 8 != 0 && (begin[map - 1] >> (h.words % 8)) != 0) {
      return DeltaError("the bitmap marks words past the end");
    }
    *values = begin + map;
    return absl::OkStatus();
  }
  const uint8_t* p = begin;
  uint64_t next = 0;  // the first word the next gap may name
  for (uint64_t k = 0; k < h.changed; ++k) {
    uint64_t gap = 0;
    if (!GetVarint(&p, begin + h.index_bytes, &gap)) {
      return DeltaError(absl::StrCat("gap ", k, " is truncated"));
    }
    if (gap >= h.words - next)
      return DeltaError(absl::StrCat("gap ", k, " names a word past the end"));
    next += gap + 1;
  }
  if (p != begin + h.index_bytes) {
    return DeltaError(
        absl::StrCat(p - begin, " bytes of gaps where the header says ", h.index_bytes));
  }
  *values = p;
  return absl::OkStatus();
}

// Writes changed word k (the k-th in word order), word i of the bucket,
// from a checked record's values.
class ValueWriter {
 public:
  ValueWriter(const DeltaHeader& h, const uint8_t* values, const uint8_t* base, uint8_t* out)
      : w_(static_cast<size_t>(h.word_bytes)),
        values_(values),
        base_(base),
        out_(out),
        xor_(h.values == DeltaValues::kXorPlanes),
        flags_(values + h.changed),
        high_(values + h.changed + (h.changed + 7) / 8) {}
  void Write(uint64_t i, uint64_t k) {
    if (!xor_) {
      std::memcpy(out_ + i * w_, values_ + k * w_, w_);
      return;
    }
    const uint8_t hi = (flags_[k / 8] >> (k % 8)) & 1u ? *high_++ : 0;
    out_[2 * i] = static_cast<uint8_t>(base_[2 * i] ^ values_[k]);
    out_[2 * i + 1] = static_cast<uint8_t>(base_[2 * i + 1] ^ hi);
  }

 private:
  size_t w_;
  const uint8_t* values_;
  const uint8_t* base_;
  uint8_t* out_;
  bool xor_;
  const uint8_t* flags_;
  const uint8_t* high_;
};

// Writes the bucket a checked record (its header `h`, its values at
// `values`) makes of `base` into `out`.
void ApplyRecord(const DeltaHeader& h, absl::string_view delta, const uint8_t* values,
                 const uint8_t* base, uint8_t* out) {
  const size_t bytes = static_cast<size_t>(h.words) * static_cast<size_t>(h.word_bytes);
  if (out != base) std::memcpy(out, base, bytes);
  const auto* index = reinterpret_cast<const uint8_t*>(delta.data()) + h.header_bytes();
  ValueWriter writer(h, values, base, out);
  if (h.index == DeltaIndex::kBitmap) {
    for (uint64_t byte = 0, k = 0; byte < (h.words + 7) / 8; ++byte) {
      for (uint8_t bits = index[byte]; bits != 0; bits &= static_cast<uint8_t>(bits - 1)) {
        writer.Write(byte * 8 + static_cast<uint64_t>(__builtin_ctz(bits)), k++);
      }
    }
    return;
  }
  const uint8_t* p = index;
  uint64_t next = 0;
  for (uint64_t k = 0; k < h.changed; ++k) {
    uint64_t gap = 0;
    GetVarint(&p, values, &gap);  // checked above
    writer.Write(next + gap, k);
    next += gap + 1;
  }
}

}  // namespace

absl::Status ReadDeltaHeader(absl::string_view delta, DeltaHeader* h) {
  const bool planes = delta.size() >= 4 && std::memcmp(delta.data(), kDeltaXorMagic, 4) == 0;
  const size_t header = planes ? kDeltaXorHeaderBytes : kDeltaHeaderBytes;
  if (delta.size() < header || (!planes && std::memcmp(delta.data(), kDeltaMagic, 4) != 0)) {
    return DeltaError(absl::StrCat(delta.size(), " bytes without an \"ASD1\" or \"ASD2\" header"));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(delta.data());
  h->word_bytes = p[4];
  if (!ValidDeltaWordBytes(h->word_bytes) || (planes && h->word_bytes != 2)) {
    return DeltaError(
        absl::StrCat("word_bytes ", h->word_bytes, planes ? " in an \"ASD2\" record" : ""));
  }
  if (p[5] != static_cast<uint8_t>(DeltaIndex::kBitmap) &&
      p[5] != static_cast<uint8_t>(DeltaIndex::kGaps)) {
    return DeltaError(absl::StrCat("unknown index kind ", int{p[5]}));
  }
  if (planes ? p[6] != static_cast<uint8_t>(DeltaValues::kXorPlanes) || p[7] != 0
             : p[6] != 0 || p[7] != 0) {
    return DeltaError(planes ? "an unknown value coding" : "reserved header bytes are not zero");
  }
  h->index = static_cast<DeltaIndex>(p[5]);
  h->values = planes ? DeltaValues::kXorPlanes : DeltaValues::kWhole;
  std::memcpy(&h->words, p + 8, 8);
  std::memcpy(&h->changed, p + 16, 8);
  std::memcpy(&h->index_bytes, p + 24, 8);
  if (h->changed > h->words)
    return DeltaError(absl::StrCat(h->changed, " changed of ", h->words, " words"));
  // Bounds every length below 2^63, so record_bytes() cannot wrap.
  if (h->words > (uint64_t{1} << 56) || h->index_bytes > (uint64_t{1} << 60)) {
    return DeltaError(absl::StrCat("a record of ", h->words, " words and an index of ",
                                   h->index_bytes, " bytes"));
  }
  h->value_bytes = h->changed * static_cast<uint64_t>(h->word_bytes);
  if (planes) {
    std::memcpy(&h->value_bytes, p + 32, 8);
    if (h->value_bytes > (uint64_t{1} << 60))
      return DeltaError(absl::StrCat(h->value_bytes, " value bytes"));
  }
  return absl::OkStatus();
}

absl::Status ApplyDelta(const uint8_t* base, absl::string_view delta, uint8_t* out, size_t bytes) {
  DeltaHeader h;
  if (absl::Status s = ReadDeltaHeader(delta, &h); !s.ok()) return s;
  if (h.words > bytes / static_cast<uint64_t>(h.word_bytes) ||
      h.words * static_cast<uint64_t>(h.word_bytes) != bytes) {
    return DeltaError(
        absl::StrCat(h.words, " words of ", h.word_bytes, " bytes for a bucket of ", bytes));
  }
  const uint8_t* values = nullptr;
  if (absl::Status s = CheckIndex(h, delta, &values); !s.ok()) return s;
  ApplyRecord(h, delta, values, base, out);
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
      return DeltaError(absl::StrCat("record ", records.size(), ": ", s.message()));
    }
    const uint64_t piece = h.words * static_cast<uint64_t>(h.word_bytes);
    if (h.record_bytes() > rest.size() || piece > bytes - covered) {
      return DeltaError(absl::StrCat("record ", records.size(), " of ", h.record_bytes(),
                                     " bytes for ", piece, " bytes at ", covered,
                                     ": past the end of the delta (", rest.size(),
                                     " bytes left) or of the bucket (", bytes, ")"));
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
    return DeltaError(absl::StrCat("records cover ", covered, " bytes of a bucket of ", bytes));
  }
  // Checked whole before any byte of `out` is written.
  for (size_t i = 0; i < records.size(); ++i) {
    Record& r = records[i];
    ReadDeltaHeader(r.bytes, &r.header).IgnoreError();  // read above
    if (absl::Status s = CheckIndex(r.header, r.bytes, &r.values); !s.ok()) {
      return DeltaError(absl::StrCat("record ", i, ": ", s.message()));
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
