#include "learner_server/learner_worker.h"

#include <glog/logging.h>

#include "common/status_macros.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<LearnerWorker>> LearnerWorker::Create(LearnerDaemonOptions o) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<LearnerCore> core, LearnerCore::Create(std::move(o)));
  ASYMPO_RETURN_IF_ERROR(core->JoinRanks());
  ASYMPO_RETURN_IF_ERROR(core->BuildModel());
  ASYMPO_RETURN_IF_ERROR(core->BuildTrainer(/*publisher=*/nullptr));  // rank 0 publishes
  ASYMPO_RETURN_IF_ERROR(core->SyncRanks());
  ASYMPO_RETURN_IF_ERROR(core->RestoreCheckpoint().status());  // with rank 0
  // Rank 0's first version: fully sharded, the unit gathers.
  ASYMPO_RETURN_IF_ERROR(core->weight_parts()(StageNothing));
  return std::unique_ptr<LearnerWorker>(new LearnerWorker(std::move(core)));
}

absl::StatusOr<int64_t> LearnerWorker::Run() {
  DataParallel& dp = *core_->dp();
  Trainer& trainer = core_->trainer();
  int64_t steps = 0;
  while (true) {
    ASYMPO_ASSIGN_OR_RETURN(StepMessage m, dp.Receive());
    core_->Progress();
    if (m.kind == StepMessage::Kind::kIdle) continue;
    if (m.kind == StepMessage::Kind::kStop) break;
    if (m.kind == StepMessage::Kind::kSave) {
      ASYMPO_RETURN_IF_ERROR(SaveWithRank0(m.save));
      continue;
    }
    StepOr<StepResult> step = trainer.StepShard(m.shard, m.totals, &dp);
    if (!step.ok()) {
      if (IsRankFailure(step.status())) return step.status();
      LOG(WARNING) << "step skipped on every rank: " << step.status().message();
      continue;
    }
    if (int64_t held_back = 0; !step->dropped.empty() && poisoned_log_.Allow(&held_back)) {
      LOG(WARNING) << step->dropped.size()
                   << " group(s) of this rank's share were dropped from the step as poisoned "
                      "(non-finite by their rewards)"
                   << poisoned_log_.HeldBack(held_back);
    }
    ++steps;
  }
  LOG(INFO) << "rank " << dp.rank() << " stopped with rank 0 after " << steps
            << " steps at version " << trainer.version();
  return steps;
}

absl::Status LearnerWorker::SaveWithRank0(int64_t what) {
  if ((what & StepMessage::kSaveCheckpoint) != 0) {
    // Rank 0 counts and logs a failed checkpoint; only a lost rank stops this one.
    absl::StatusOr<CheckpointInfo> saved = core_->SaveCheckpoint({});
    if (!saved.ok() && IsRankFailure(saved.status())) return saved.status();
    if (!saved.ok()) LOG(WARNING) << "checkpoint: " << saved.status().message();
  }
  if ((what & StepMessage::kSaveExport) != 0) {
    const absl::Status exported = core_->ExportWeights();
    if (IsRankFailure(exported)) return exported;
  }
  return absl::OkStatus();
}

}  // namespace asympo::learner
