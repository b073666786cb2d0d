// A data-parallel rank other than 0: it trains the share of each step that
// rank 0 sends it, and nothing else (no gRPC server, queue, checkpoints,
// step log, export or metrics of its own: rank 0's figures cover its
// steps). It stops when rank 0 says so, or when a collective fails.
// Run is the trainer thread.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/log_throttle.h"
#include "learner_server/learner_core.h"
#include "learner_server/learner_options.h"
#include "learner_server/learner_role.h"

namespace asympo::learner {

class LearnerWorker final : public LearnerRole {
 public:
  // Joins the other ranks, builds the model and the trainer, and takes
  // rank 0's weights, moments and version. Errors name the bad option.
  static absl::StatusOr<std::unique_ptr<LearnerWorker>> Create(LearnerDaemonOptions options);

  // Trains what rank 0 sends until it says stop; a failed collective ends
  // it with that error.
  absl::StatusOr<int64_t> Run() override;
  // Nothing to do: a worker stops with rank 0.
  void Shutdown() override {}
  int64_t received_bytes() const override { return 0; }
  uint64_t version() const override { return core_->version(); }

 private:
  explicit LearnerWorker(std::unique_ptr<LearnerCore> core) : core_(std::move(core)) {}
  // Rank 0's kSave: this rank's part of the checkpoint and the export.
  absl::Status SaveWithRank0(int64_t what);

  std::unique_ptr<LearnerCore> core_;
  LogThrottle poisoned_log_;
};

}  // namespace asympo::learner
