#include "learner_server/learner_daemon.h"

#include <utility>

#include "learner_server/learner_rank0.h"
#include "learner_server/learner_worker.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<LearnerDaemon>> LearnerDaemon::Create(
    LearnerDaemonOptions options, prometheus::Registry& registry) {
  std::unique_ptr<LearnerRole> role;
  if (options.data_parallel.world_size > 1 && options.data_parallel.rank != 0) {
    auto worker = LearnerWorker::Create(std::move(options));
    if (!worker.ok()) return worker.status();
    role = *std::move(worker);
  } else {
    auto rank0 = LearnerRank0::Create(std::move(options), registry);
    if (!rank0.ok()) return rank0.status();
    role = *std::move(rank0);
  }
  return std::unique_ptr<LearnerDaemon>(new LearnerDaemon(std::move(role)));
}

}  // namespace asympo::learner
