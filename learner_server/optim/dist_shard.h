// What each data-parallel rank keeps (--dist_shard), shared by the learner
// (data_parallel.h) and its memory plan (memory_plan.h). Free of LibTorch.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asympo::learner {

// kNone: everything (the gradients all-reduced); kOptimizer (ZeRO-1): the
// weights and gradients whole, 1/world_size of the AdamW moments; kFull:
// 1/world_size of the float32 master weights, the gradients and the
// moments, each layer's weights gathered when it runs.
enum class DistShard { kNone = 0, kOptimizer = 1, kFull = 2 };

// "none", "optimizer", "full".
absl::string_view DistShardName(DistShard shard);
// INVALID_ARGUMENT names the value and the choices.
absl::StatusOr<DistShard> ParseDistShard(absl::string_view text);

// Full sharding needs more than one rank: with one there is nothing to
// shard over, and the rank would run unsharded, without the recomputation
// of every layer that full sharding brings (and the memory plan assumes).
// INVALID_ARGUMENT naming --dist_shard=full and the flag that gives the
// checkpointing alone; OK for any other mode or world.
absl::Status CheckShardWorld(DistShard shard, int64_t world_size);

}  // namespace asympo::learner
