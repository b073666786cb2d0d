// Delta of one snapshot bucket against the same bucket of the version
// before: the words (2 bytes for bfloat16 and float16 buckets, 4 for
// float32) whose bits changed, with their new values. Between two RL steps
// at the learning rates post-training uses, most bfloat16 words do not
// change at all (docs/benchmarks.md, "Delta versions"), so a version can
// travel as a small fraction of its bytes.
//
// A record (little-endian) covers `words` consecutive words. Its header is
// one of two:
//   "ASD1" | word_bytes (1) | index kind (1) | 2 zero bytes |
//   words (uint64) | changed (uint64) | index_bytes (uint64)          32 bytes
//   "ASD2" | word_bytes (1, = 2) | index kind (1) | value coding (1, = 1) |
//   1 zero byte | words | changed | index_bytes | value_bytes (uint64)  40 bytes
// then the index of the changed words (index_bytes), then their values, in
// word order. The index is whichever is smaller for this record: a bitmap
// (one bit per word, LSB first; kBitmap) or the gaps between changed words
// as LEB128 varints (the first from the record's word 0; kGaps).
//
// The values: in "ASD1", each changed word's new value (changed x
// word_bytes). In "ASD2" (2-byte words), each changed word's XOR with its
// base, in planes: the low bytes (changed bytes), a bitmap over the changed
// words of those whose high byte changes too (ceil(changed / 8) bytes, LSB
// first), then those high bytes (one per bit set). A bfloat16 word that
// moves by a few units of its last place changes in its low byte only (its
// 7 mantissa bits and the exponent's lowest), so it costs about one byte
// instead of two. The encoder writes whichever record is smaller.
//
// A record's length follows from its header, so records concatenate: a
// bucket's delta is its records in order, each covering the next piece of
// the bucket (EncodeDeltaPieces), which threads encode and apply side by
// side. A bucket is rebuilt from the base and the delta, and then checked
// against the manifest's CRC-32C like any other bucket: a wrong base or a
// corrupt delta never passes as weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace asympo::broadcast {

enum class DeltaIndex : uint8_t { kBitmap = 1, kGaps = 2 };

// How a record carries the changed words: their new values ("ASD1"), or
// their XOR with the base in byte planes ("ASD2").
enum class DeltaValues : uint8_t { kWhole = 0, kXorPlanes = 1 };

inline constexpr size_t kDeltaHeaderBytes = 32;     // "ASD1"
inline constexpr size_t kDeltaXorHeaderBytes = 40;  // "ASD2"

// The delta turning `base` into `next` (both `bytes` long; `bytes` a
// multiple of `word_bytes`, which is 1, 2, 4 or 8). InvalidArgument
// otherwise.
absl::Status EncodeDelta(const uint8_t* base, const uint8_t* next, size_t bytes, int word_bytes,
                         std::string* delta);

// Writes into `out` (`bytes` long; it may be `base` itself) the bucket that
// `delta` makes of `base`. Every field is checked before `out` is written:
// InvalidArgument naming what does not hold (another size, an index past the
// end or not matching its count, a truncated or overlong delta), with `out`
// untouched.
absl::Status ApplyDelta(const uint8_t* base, absl::string_view delta, uint8_t* out, size_t bytes);

// The fields of a record's header (after ApplyDelta's checks of it), and
// the record's length.
struct DeltaHeader {
  int word_bytes = 0;
  DeltaIndex index = DeltaIndex::kBitmap;
  DeltaValues values = DeltaValues::kWhole;
  uint64_t words = 0;
  uint64_t changed = 0;
  uint64_t index_bytes = 0;
  uint64_t value_bytes = 0;  // "ASD1": changed x word_bytes

  uint64_t header_bytes() const {
    return values == DeltaValues::kWhole ? kDeltaHeaderBytes : kDeltaXorHeaderBytes;
  }
  uint64_t record_bytes() const { return header_bytes() + index_bytes + value_bytes; }
};
absl::Status ReadDeltaHeader(absl::string_view delta, DeltaHeader* header);

// How many of the `bytes / word_bytes` words of `a` and `b` differ (one
// compare pass, no output).
uint64_t CountChangedWords(const uint8_t* a, const uint8_t* b, size_t bytes, int word_bytes);

// A bucket's delta as one record per `piece_bytes` of it (a multiple of
// `word_bytes`; the last piece may be shorter), encoded on up to `threads`
// threads. With `next_crc`, also the CRC-32C of `next`, each piece
// checksummed while it is in cache. Errors as EncodeDelta.
absl::Status EncodeDeltaPieces(const uint8_t* base, const uint8_t* next, size_t bytes,
                               int word_bytes, size_t piece_bytes, int threads, std::string* delta,
                               uint32_t* next_crc = nullptr);

// Rebuilds a bucket from `base` and a delta of records (EncodeDeltaPieces's
// or EncodeDelta's) into `out` (not `base`), on up to `threads` threads,
// and sets `*crc` to the CRC-32C of the result, each piece checksummed
// while it is in cache. Every record is checked before `out` is written:
// InvalidArgument naming the record (records that do not cover `bytes`
// exactly, or one that ApplyDelta refuses), with `out` untouched.
absl::Status ApplyDeltaPieces(const uint8_t* base, absl::string_view delta, uint8_t* out,
                              size_t bytes, int threads, uint32_t* crc);

}  // namespace asympo::broadcast
