#include "learner_server/optim/dist_shard.h"

#include "absl/strings/str_cat.h"

namespace asympo::learner {

absl::string_view DistShardName(DistShard shard) {
  switch (shard) {
    case DistShard::kOptimizer:
      return "optimizer";
    case DistShard::kFull:
      return "full";
    case DistShard::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<DistShard> ParseDistShard(absl::string_view text) {
  for (const DistShard s : {DistShard::kNone, DistShard::kOptimizer, DistShard::kFull}) {
    if (text == DistShardName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a sharding mode; expected none, optimizer or full"));
}

absl::Status CheckShardWorld(DistShard shard, int64_t world_size) {
  if (shard != DistShard::kFull || world_size > 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--dist_shard=full with a world of ", world_size,
      " rank: there is nothing to shard over, and one rank would keep everything and recompute "
      "nothing; drop --dist_shard (add --activation_checkpointing=layers to recompute every "
      "layer) or run more ranks"));
}

}  // namespace asympo::learner
