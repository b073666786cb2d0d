// What the checkpoint's save and restore (checkpoint.h) share: the ranks'
// agreement on an outcome, and where a version's directory is.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "learner_server/trainer/checkpoint.h"

namespace asympo::learner {

inline int RankOf(const CheckpointRanks& r) { return r.collectives ? r.collectives->rank() : 0; }
inline int WorldOf(const CheckpointRanks& r) {
  return r.collectives ? r.collectives->world_size() : 1;
}

// Sums `values` over the ranks (a collective; nothing alone).
absl::Status SumOverRanks(const CheckpointRanks& r, std::vector<double>* values);

// A collective: the ranks whose `status` is not OK, known to every rank.
absl::StatusOr<std::vector<int>> FailedRanks(const CheckpointRanks& r, const absl::Status& status);

// This rank's own error, or one naming the ranks that failed at `what`.
absl::Status Agreed(const absl::Status& own, const std::vector<int>& failed,
                    const std::string& what);

// <root>/ckpt-<version, 12 digits>.
std::string CheckpointDir(const std::string& root, uint64_t version);

}  // namespace asympo::learner
