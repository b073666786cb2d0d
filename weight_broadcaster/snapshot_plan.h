// The bucket layout of a model's snapshots, planned once (docs/protocol.md,
// "Weight broadcast"): the sender that publishes them makes it
// (SnapshotStore::Plan), the learner's staging lays its host and device
// copies out as it says, and the sender adopts that host memory as the
// snapshot's buckets without copying it again.
//
// The layout is one flat buffer per copy: bucket b of the manifest at
// bucket_start(b), the buckets one after the other, each aligned to
// kBucketAlignment (or the packing's alignment where that is larger); tensor
// t at tensor_start(t) = its bucket's start + its manifest offset. The gaps
// inside a bucket must be zero (each bucket's CRC-32C covers them). Immutable
// and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast {

inline constexpr uint64_t kBucketAlignment = 64;

class SnapshotPlan {
 public:
  // PlanSnapshot(specs, 0, packing) and the flat layout; its errors.
  static absl::StatusOr<std::shared_ptr<const SnapshotPlan>> Make(
      const std::vector<TensorSpec>& specs, const PackingOptions& packing);

  // What every snapshot's manifest starts from: version 0, checksums 0.
  const v1::SnapshotManifest& manifest() const { return manifest_; }
  int buckets() const { return manifest_.buckets_size(); }
  uint64_t bucket_start(int b) const { return bucket_starts_[static_cast<size_t>(b)]; }
  uint64_t bucket_bytes(int b) const { return manifest_.buckets(b).size_bytes(); }
  uint64_t tensor_start(int t) const;
  // The flat buffer's size: the last bucket's end.
  uint64_t flat_bytes() const { return flat_bytes_; }

 private:
  SnapshotPlan() = default;

  v1::SnapshotManifest manifest_;
  std::vector<uint64_t> bucket_starts_;
  uint64_t flat_bytes_ = 0;
};

// The buffer of `pool` that nobody else holds (a snapshot let it go: it is
// reused, already faulted in), or a new one from `make()`, added to the
// pool. Other buffers nobody holds are let go, so that the pool keeps one
// spare at most.
template <typename T, typename Make>
std::shared_ptr<T> ReuseOrMake(std::vector<std::shared_ptr<T>>& pool, Make make) {
  std::shared_ptr<T> free;
  for (auto it = pool.begin(); it != pool.end();) {
    if (it->use_count() > 1) {
      ++it;
    } else if (free == nullptr) {
      free = *it++;
    } else {
      it = pool.erase(it);
    }
  }
  if (free == nullptr) {
    free = make();
    pool.push_back(free);
  }
  return free;
}

}  // namespace asympo::broadcast
