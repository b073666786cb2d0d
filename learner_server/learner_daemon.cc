#include "learner_server/learner_daemon.h"

#include <utility>

#include "common/status_macros.h"
#include "learner_server/learner_rank0.h"
#include "learner_server/learner_worker.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<LearnerDaemon>> LearnerDaemon::Create(
    LearnerDaemonOptions options, prometheus::Registry& registry) {
  std::unique_ptr<LearnerRole> role;
  if (options.data_parallel.world_size > 1 && options.data_parallel.rank != 0) {
    ASYMPO_ASSIGN_OR_RETURN(role, LearnerWorker::Create(std::move(options)));
  } else {
    ASYMPO_ASSIGN_OR_RETURN(role, LearnerRank0::Create(std::move(options), registry));
  }
  return std::unique_ptr<LearnerDaemon>(new LearnerDaemon(std::move(role)));
}

}  // namespace asympo::learner
