#include "weight_broadcaster/snapshot_plan.h"

#include <algorithm>

#include "common/status_macros.h"

namespace asympo::broadcast {

absl::StatusOr<std::shared_ptr<const SnapshotPlan>> SnapshotPlan::Make(
    const std::vector<TensorSpec>& specs, const PackingOptions& packing) {
  std::shared_ptr<SnapshotPlan> plan(new SnapshotPlan());
  ASYMPO_ASSIGN_OR_RETURN(plan->manifest_, PlanSnapshot(specs, 0, packing));
  const uint64_t align = std::max(kBucketAlignment, packing.alignment);
  uint64_t end = 0;
  for (const v1::BucketInfo& b : plan->manifest_.buckets()) {
    const uint64_t start = (end + align - 1) / align * align;
    plan->bucket_starts_.push_back(start);
    end = start + b.size_bytes();
  }
  plan->flat_bytes_ = end;
  return std::shared_ptr<const SnapshotPlan>(std::move(plan));
}

uint64_t SnapshotPlan::tensor_start(int t) const {
  const v1::TensorEntry& e = manifest_.tensors(t);
  return bucket_starts_[e.bucket()] + e.offset();
}

}  // namespace asympo::broadcast
