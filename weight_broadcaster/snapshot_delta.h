// A published version as a delta against the version published before it
// (docs/protocol.md, "Delta versions"): each bucket's changed words
// (delta_codec.h) in records of kDeltaPieceBytes, or the whole bucket where
// its delta would not save enough. The store encodes it when it publishes;
// a fetch that names the base sends it (FetchSnapshotRequest.has_base), and
// the receiver rebuilds each bucket and checks the manifest's CRC-32C.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/delta_codec.h"

namespace asympo::broadcast {

// The bytes of bucket a record covers: threads split a bucket by records,
// and each record is rebuilt and checksummed while it is in cache.
inline constexpr size_t kDeltaPieceBytes = size_t{1} << 20;

// A bucket in which more than this fraction of the words changed
// (estimated from every kDeltaSampleEvery-th record's piece of it) travels
// whole: its delta would save little and cost the encoding and the rebuild
// (docs/benchmarks.md, "Delta versions through the weight broadcaster").
inline constexpr double kMaxDeltaDensity = 0.25;
inline constexpr size_t kDeltaSampleEvery = 8;

// The longest delta a receiver accepts for a bucket of `bucket_bytes`: a
// longer one than the bucket plus a record header per piece saves nothing.
inline uint64_t MostDeltaBytes(uint64_t bucket_bytes) {
  return bucket_bytes + (bucket_bytes / kDeltaPieceBytes + 1) * kDeltaHeaderBytes;
}

// Threads that rebuild a received bucket from its delta (records side by
// side).
inline int DeltaApplyThreads() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
}

struct SnapshotDelta {
  uint64_t base_version = 0;
  // buckets[b]: bucket b's delta, or empty when bucket b travels whole.
  std::vector<std::string> buckets;
  // What a fetch of the delta sends: the deltas and the whole buckets.
  uint64_t bytes = 0;
};

// The word a bucket's delta compares: the smallest element size of the
// bucket's tensors (2 for bfloat16 and float16, 4 for float32), or 1 when
// the bucket is not made of whole such words.
int DeltaWordBytes(const v1::SnapshotManifest& manifest, int bucket);

// The delta turning `base` into `next`, both laid out by `manifest` (bucket
// b at base[b] and next[b], manifest.buckets(b).size_bytes() long),
// encoded on up to `threads` threads, and the CRC-32C of each bucket of
// `next` in `next_crcs` (taken in the same pass). A bucket where too many
// words changed (kMaxDeltaDensity), or whose delta would exceed half of it,
// travels whole.
absl::StatusOr<std::shared_ptr<const SnapshotDelta>> EncodeSnapshotDelta(
    const v1::SnapshotManifest& manifest, const std::vector<const char*>& base,
    const std::vector<const char*>& next, uint64_t base_version, int threads,
    std::vector<uint32_t>* next_crcs);

}  // namespace asympo::broadcast
