#include "weight_broadcaster/wire_format.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace asympo::broadcast {
namespace {

// WeightChunk's field numbers and protobuf wire types.
constexpr uint32_t kVersion = 1, kBucket = 2, kOffset = 3, kData = 4, kDeltaBytes = 5;
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads bytes across slice boundaries.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool AtEnd() const { return slice_ == slices_.size(); }
  size_t slice() const { return slice_; }
  size_t pos() const { return pos_; }

  bool Byte(uint8_t* b) {
    if (AtEnd()) return false;
    *b = slices_[slice_].begin()[pos_];
    ++pos_;
    SkipEmpty();
    return true;
  }

  // A varint of at most `max_bytes` bytes: 10 for a value, 5 for a tag or
  // a length, as protobuf's parser reads them (a longer one, even of a
  // small value, fails its parse).
  bool Varint(uint64_t* v, int max_bytes = 10) {
    *v = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than max_bytes bytes
  }

  bool Skip(uint64_t n) {
    while (n > 0) {
      if (AtEnd()) return false;
      const size_t step = static_cast<size_t>(std::min<uint64_t>(n, slices_[slice_].size() - pos_));
      pos_ += step;
      n -= step;
      SkipEmpty();
    }
    return true;
  }

 private:
  void SkipEmpty() {
    while (slice_ < slices_.size() && pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
};

}  // namespace

std::string EncodeChunkHeader(uint64_t version, uint32_t bucket, uint64_t offset,
                              uint64_t data_size, uint64_t delta_bytes) {
  std::string h;
  h.reserve(56);
  if (version != 0) {
    PutVarint(kVersion << 3 | kVarint, &h);
    PutVarint(version, &h);
  }
  if (bucket != 0) {
    PutVarint(kBucket << 3 | kVarint, &h);
    PutVarint(bucket, &h);
  }
  if (offset != 0) {
    PutVarint(kOffset << 3 | kVarint, &h);
    PutVarint(offset, &h);
  }
  if (delta_bytes != 0) {
    PutVarint(kDeltaBytes << 3 | kVarint, &h);
    PutVarint(delta_bytes, &h);
  }
  if (data_size != 0) {
    PutVarint(kData << 3 | kLengthDelimited, &h);
    PutVarint(data_size, &h);
  }
  return h;
}

absl::StatusOr<ChunkView> ParseChunk(const std::vector<grpc::Slice>& slices) {
  ChunkView c;
  Cursor in(slices);
  while (!in.AtEnd()) {
    // Cut to 32 bits, as protobuf's parser cuts a 5-byte tag: bits above
    // them must not hide a known field from this reader alone.
    uint64_t wide_key;
    if (!in.Varint(&wide_key, 5)) return absl::DataLossError("bad field key in a chunk");
    const uint32_t key = static_cast<uint32_t>(wide_key);
    const uint32_t field = key >> 3;
    const uint32_t type = key & 7;
    if (field == 0) return absl::DataLossError("field number 0 in a chunk");
    uint64_t value = 0;
    switch (type) {
      case kVarint:
        if (!in.Varint(&value)) return absl::DataLossError("truncated varint in a chunk");
        if (field == kVersion) c.version = value;
        if (field == kBucket) c.bucket = static_cast<uint32_t>(value);
        if (field == kOffset) c.offset = value;
        if (field == kDeltaBytes) c.delta_bytes = value;
        break;
      case kLengthDelimited:
        if (!in.Varint(&value, 5) || value > 0x7fffffff) {
          return absl::DataLossError("bad field length in a chunk");
        }
        if (field == kData) {
          c.size = value;
          c.slice = in.slice();
          c.pos = in.pos();
        }
        if (!in.Skip(value)) {
          return absl::DataLossError(absl::StrCat("field ", field, " of a chunk declares ", value,
                                                  " bytes beyond the message's end"));
        }
        break;
      case kFixed64:
        if (!in.Skip(8)) return absl::DataLossError("truncated fixed64 in a chunk");
        break;
      case kFixed32:
        if (!in.Skip(4)) return absl::DataLossError("truncated fixed32 in a chunk");
        break;
      default:
        return absl::DataLossError(absl::StrCat("wire type ", type, " in a chunk"));
    }
    if ((field == kVersion || field == kBucket || field == kOffset || field == kDeltaBytes) &&
        type != kVarint) {
      return absl::DataLossError(absl::StrCat("chunk field ", field, " has wire type ", type));
    }
    if (field == kData && type != kLengthDelimited) {
      return absl::DataLossError(absl::StrCat("chunk data has wire type ", type));
    }
  }
  return c;
}

void CopyChunkData(const std::vector<grpc::Slice>& slices, const ChunkView& chunk, char* dest,
                   uint32_t* crc) {
  uint64_t left = chunk.size;
  size_t pos = chunk.pos;
  for (size_t s = chunk.slice; left > 0; ++s, pos = 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, slices[s].size() - pos));
    std::memcpy(dest, slices[s].begin() + pos, n);
    *crc = Crc32c(dest, n, *crc);  // just written: still in cache
    dest += n;
    left -= n;
  }
}

}  // namespace asympo::broadcast
