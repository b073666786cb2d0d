// What both roles of the learner daemon are built on (LearnerRank0 and
// LearnerWorker): the options, the model, its trainer, the data-parallel
// group and the progress hook.
//
// A role builds it in steps, in the order its start needs: Create (the
// options checked), JoinRanks, BuildModel, BuildTrainer, SyncRanks,
// RestoreCheckpoint. Not
// thread-safe: the trainer thread's, except version().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "learner_server/learner_options.h"
#include "learner_server/parallel/data_parallel.h"
#include "learner_server/trainer/checkpoint.h"
#include "learner_server/trainer/trainer.h"

namespace asympo::learner {

class LearnerCore {
 public:
  // INVALID_ARGUMENT naming the option (ValidateLearnerDaemonOptions).
  static absl::StatusOr<std::unique_ptr<LearnerCore>> Create(LearnerDaemonOptions options);

  // With world_size > 1, joins the other ranks (DataParallel::Create).
  absl::Status JoinRanks();
  // Builds (or loads) the model; the batch limits take its vocabulary, and
  // behavior log-probs are required for GRPO.
  absl::Status BuildModel();
  // The trainer, publishing each version through `publisher` (null: none,
  // as on a worker; it must outlive the trainer's steps).
  absl::Status BuildTrainer(WeightPublisher* publisher);
  // Data parallelism: every rank starts from rank 0's weights, moments and
  // version, and with DistShard::kOptimizer keeps its shard of the moments.
  absl::Status SyncRanks();
  // Collective, after SyncRanks: every rank restores its part of the newest
  // valid checkpoint under --checkpoint_dir (nullopt: none, or no
  // directory), and takes its version.
  absl::StatusOr<std::optional<CheckpointInfo>> RestoreCheckpoint();
  // Collective (every rank, on rank 0's kSave message): writes this rank's
  // part of a checkpoint of the current version under --checkpoint_dir
  // (`save`'s other fields are rank 0's to give) and joins the export's
  // gathers when `export_weights`. `alone`: rank 0 only, after the other
  // ranks failed (its state must be whole: not sharded).
  absl::StatusOr<CheckpointInfo> SaveCheckpoint(CheckpointSave save, bool alone = false);
  // The weights part by part (Trainer::VisitWeightParts): fully sharded, a
  // collective every rank joins (rank 0's first version at start, the
  // export); its stage callback runs on rank 0.
  WeightParts weight_parts();
  // Collective (on kSave with kSaveExport): rank 0 exports the policy to
  // --export_dir; fully sharded, every rank joins the gathers, a unit at a
  // time, and rank 0 writes each unit's shard as it comes.
  absl::Status ExportWeights();
  // The ranks a checkpoint is written and read by.
  CheckpointRanks checkpoint_ranks() const;
  // The liveness hook (LearnerDaemonOptions::on_progress), if any.
  void Progress() const;

  LearnerDaemonOptions& options() { return options_; }
  const LearnerDaemonOptions& options() const { return options_; }
  // Null without data parallelism.
  DataParallel* dp() const { return dp_.get(); }
  PolicyModel& model() const { return *model_; }
  Trainer& trainer() const { return *trainer_; }
  // Any thread.
  uint64_t version() const { return trainer_->version(); }
  // Whether the optimizer state is spread over the ranks (ZeRO-1).
  bool sharded() const { return trainer_->optimizer_sharded(); }

 private:
  explicit LearnerCore(LearnerDaemonOptions options) : options_(std::move(options)) {}

  // Declared in dependency order, so that what is used is destroyed last.
  LearnerDaemonOptions options_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<PolicyModel> model_;
  std::string base_;  // with adapters: the base's identity (base_identity.h)
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace asympo::learner
