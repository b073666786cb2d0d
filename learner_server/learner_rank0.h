// Rank 0 of the learner (the only rank without data parallelism): serves
// the Learner and WeightBroadcast services on its port (LearnerEndpoint),
// owns the bounded queue, trains a step from it after another (in a
// data-parallel job, sending each other rank its share), checkpoints,
// publishes the weights, writes the step log (StepLog) and the metrics.
// Thread-safe where stated; Run is the trainer thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "common/log_throttle.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/learner_service.h"
#include "learner_server/admission/policy_lag.h"
#include "learner_server/admission/source_quarantine.h"
#include "learner_server/admission/step_intake.h"
#include "learner_server/admission_watch.h"
#include "learner_server/learner_core.h"
#include "learner_server/learner_endpoint.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/learner_options.h"
#include "learner_server/learner_role.h"
#include "learner_server/progress_watch.h"
#include "learner_server/snapshot_publisher.h"
#include "learner_server/step_log.h"
#include "learner_server/trainer/skipped_steps.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace asympo::learner {

class LearnerRank0 final : public LearnerRole {
 public:
  // Builds everything, restores the newest checkpoint, publishes its
  // version and starts the gRPC server; metrics go to `registry`, which
  // must outlive the daemon. Errors name the bad option or file.
  static absl::StatusOr<std::unique_ptr<LearnerRank0>> Create(LearnerDaemonOptions options,
                                                              prometheus::Registry& registry);
  ~LearnerRank0() override;

  // Trains until Shutdown(), max_steps or a rank failure; then
  // checkpoints (not after a rank failure with a sharded optimizer) and
  // tells the other ranks to stop.
  absl::StatusOr<int64_t> Run() override;
  void Shutdown() override;
  int64_t received_bytes() const override {
    return received_bytes_.load(std::memory_order_relaxed);
  }
  uint64_t version() const override { return core_->version(); }
  absl::Status Readiness() const override { return watch_->Check(absl::Now()); }

  int port() const { return endpoint_->port(); }
  const PolicyLag& policy_lag() const { return *policy_lag_; }
  const SkippedSteps& skipped_steps() const { return *skipped_; }

 private:
  explicit LearnerRank0(std::unique_ptr<LearnerCore> core) : core_(std::move(core)) {}
  // The parts of Create.
  absl::Status BuildPublisher(prometheus::Registry& registry);
  absl::Status RestoreCheckpoint();
  absl::Status StartServer(prometheus::Registry& registry);
  // One step from the queue: false once stopping (its groups counted in
  // `untrained`).
  bool TrainOneStep(int64_t* steps, int64_t* untrained);
  // After a trained step: metrics, step log, and a checkpoint when due
  // (false: a rank failed).
  bool AfterStep(int64_t steps, const StepResult& step, const std::vector<SourceReward>& rewards);
  // The step across the ranks; a failed collective ends the job.
  StepOr<StepResult> StepAcrossRanks(const std::vector<QueuedGroup>& groups);
  // Ends the run after a rank failure (Run returns `status`).
  void Fail(absl::Status status);
  // Counts a skipped step; past max_consecutive_skipped_steps in a row,
  // stops the job (Fail) and returns true.
  bool TooManySkipped(const absl::Status& last);
  // Counts groups dropped from a step as poisoned, one per entry of
  // `sources` (in skipped_groups unless `counted` already), and may
  // quarantine their sources. In data-parallel mode, rank 0's share only.
  void DropPoisoned(const std::vector<std::string>& sources, bool counted = false);
  // Writes a checkpoint (and the export) with every rank; a failure is
  // counted and logged. `alone`: the other ranks are lost (unsharded only).
  absl::Status Checkpoint(bool alone = false);
  absl::Status WriteCheckpoint(bool alone);

  const LearnerDaemonOptions& options() const { return core_->options(); }

  // Declared in dependency order: what is used by another member comes
  // first, so that it is destroyed after it.
  std::unique_ptr<LearnerCore> core_;       // the options, model, trainer, ranks
  std::atomic<int64_t> received_bytes_{0};  // of every request (CountReceived)
  LearnerSecurity security_;
  // The snapshot store, and the transports that read it.
  std::unique_ptr<broadcast::SnapshotStore> store_;
  std::unique_ptr<broadcast::BroadcastSender> sender_;
  std::unique_ptr<SnapshotPublisher> publisher_;
  std::unique_ptr<broadcast::WeightGroup> weight_group_;  // outlives endpoint_, which serves it
  std::unique_ptr<LearnerMetrics> metrics_;
  std::unique_ptr<SkippedSteps> skipped_;
  std::unique_ptr<SourceQuarantine> quarantine_;
  std::unique_ptr<PolicyLag> policy_lag_;
  LogThrottle poisoned_log_;
  std::unique_ptr<GroupQueue> queue_;
  std::unique_ptr<StepIntake> intake_;  // over queue_ and policy_lag_
  std::unique_ptr<AdmissionWatch> admission_watch_;
  LearnerCounters counters_;
  std::unique_ptr<StepLog> step_log_;
  std::unique_ptr<ProgressWatch> watch_;  // the training loop reports, /ready checks
  // Serves the queue, the counters and the sender; destroyed first.
  std::unique_ptr<LearnerEndpoint> endpoint_;
  std::atomic<bool> stopping_{false};
  absl::Status failure_;  // a rank failure (trainer thread only)
  int64_t skipped_in_a_row_ = 0;
  // The batches of the restored checkpoint, for the queue's ledger.
  std::vector<CheckpointBatch> restored_batches_;
  // This process's incarnation (a random id) and the checkpoint version it
  // resumed from (LearnerStatus).
  std::string incarnation_;
  uint64_t resumed_from_ = 0;
};

}  // namespace asympo::learner
