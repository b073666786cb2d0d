// The learner daemon of one process: its options, and the factory that
// builds the daemon for its rank. Rank 0 (LearnerRank0) serves the Learner
// and WeightBroadcast services, owns the bounded queue, trains, checkpoints,
// publishes the weights and writes the step log; in a data-parallel job the
// other ranks (LearnerWorker) only train the share of each step that rank 0
// sends them. Both are built on LearnerCore (the model, the trainer, the
// data-parallel group and the progress hook).
// learner_server/main.cc turns flags into LearnerDaemonOptions and owns the
// metrics registry and its endpoint.
//
// Run() blocks on the calling thread, training step after step, until
// Shutdown() (from any thread, e.g. a signal handler thread) or max_steps.
// A step that fails is skipped and counted by reason (SkippedSteps); its
// groups are not trained on, and training goes on. Shutdown stops accepting
// batches, lets the current step finish, writes a checkpoint and logs how
// many queued groups were left untrained.
#pragma once

#include <cstdint>
#include <memory>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "learner_server/learner_options.h"
#include "learner_server/learner_role.h"

namespace asympo::learner {

// The daemon of one rank: rank 0's or a worker's role (learner_role.h).
class LearnerDaemon final {
 public:
  // The daemon for options.data_parallel's rank: builds everything (rank 0
  // restores the newest checkpoint and starts the gRPC server); metrics go
  // to `registry`, which must outlive the daemon. Errors name the bad
  // option or file.
  static absl::StatusOr<std::unique_ptr<LearnerDaemon>> Create(LearnerDaemonOptions options,
                                                               prometheus::Registry& registry);

  // LearnerRole's contract: Run trains until Shutdown (any thread),
  // max_steps or rank 0's stop and returns the steps it trained;
  // received_bytes, version and Readiness may be read from any thread.
  absl::StatusOr<int64_t> Run() { return role_->Run(); }
  void Shutdown() { role_->Shutdown(); }
  int64_t received_bytes() const { return role_->received_bytes(); }
  uint64_t version() const { return role_->version(); }
  absl::Status Readiness() const { return role_->Readiness(); }

 private:
  explicit LearnerDaemon(std::unique_ptr<LearnerRole> role) : role_(std::move(role)) {}
  std::unique_ptr<LearnerRole> role_;
};

}  // namespace asympo::learner
