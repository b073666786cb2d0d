// Delta of one snapshot bucket against the same bucket of the version
// before: the words (2 bytes for bfloat16 and float16 buckets, 4 for
// float32) whose bits changed, with their new values. Between two RL steps
// at the learning rates post-training uses, most bfloat16 words do not
// change at all (docs/benchmarks.md, "Delta versions"), so a version can
// travel as a small fraction of its bytes.
//
// Layout (little-endian): a 24-byte header
//   "ASD1" | word_bytes (1) | index kind (1) | 2 zero bytes |
//   words (uint64) | changed (uint64)
// then the index of the changed words, then their new values (changed x
// word_bytes), in word order. The index is whichever is smaller for this
// delta: a bitmap (one bit per word, LSB first; kBitmap) or the gaps between
// changed words as LEB128 varints (the first from word 0; kGaps). A bucket
// is rebuilt from the base and the delta, and then checked against the
// manifest's CRC-32C like any other bucket: a wrong base or a corrupt delta
// never passes as weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace asympo::broadcast {

enum class DeltaIndex : uint8_t { kBitmap = 1, kGaps = 2 };

inline constexpr size_t kDeltaHeaderBytes = 24;

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

// The fields of a delta's header (after ApplyDelta's checks of it).
struct DeltaHeader {
  int word_bytes = 0;
  DeltaIndex index = DeltaIndex::kBitmap;
  uint64_t words = 0;
  uint64_t changed = 0;
};
absl::Status ReadDeltaHeader(absl::string_view delta, DeltaHeader* header);

}  // namespace asympo::broadcast
