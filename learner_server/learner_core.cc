#include "learner_server/learner_core.h"

#include <glog/logging.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "common/batch_validation.h"
#include "common/model/base_identity.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/model/peft_adapter.h"
#include "common/status_macros.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<LearnerCore>> LearnerCore::Create(LearnerDaemonOptions options) {
  ASYMPO_RETURN_IF_ERROR(ValidateLearnerDaemonOptions(options));
  return std::unique_ptr<LearnerCore>(new LearnerCore(std::move(options)));
}

absl::Status LearnerCore::JoinRanks() {
  if (options_.data_parallel.world_size <= 1) return absl::OkStatus();
  ASYMPO_ASSIGN_OR_RETURN(dp_, DataParallel::Create(options_.data_parallel));
  return absl::OkStatus();
}

absl::Status LearnerCore::BuildModel() {
  const LearnerDaemonOptions& o = options_;
  ASYMPO_ASSIGN_OR_RETURN(model_,
                          CreateOrLoadPolicyModel(o.model, o.tiny_vocab_size, o.model_options));
  if (model_->has_adapters()) {
    // Checkpoints of adapters name their base; a resume checks it. Rank 0
    // writes meta.json and checks: it alone reads the base's files again.
    if (dp_ == nullptr || dp_->rank() == 0) {
      const absl::Time start = absl::Now();
      ASYMPO_ASSIGN_OR_RETURN(base_, BaseIdentity(o.model, *model_));
      LOG(INFO) << "the base's identity: " << base_ << " ("
                << absl::ToDoubleSeconds(absl::Now() - start) << " s)";
    }
    const LoraOptions& l = o.model_options.lora;
    int64_t adapter = 0;
    for (const at::Tensor& p : model_->parameters()) adapter += p.numel();
    LOG(INFO) << "adapters: rank " << l.rank << ", alpha " << l.alpha << " on "
              << LoraTargetsName(l.targets) << ": " << adapter << " trained parameters (float32); "
              << "the base " << o.model << " is frozen in " << DTypeName(model_->compute_dtype());
  }
  BatchLimits& limits = options_.service.limits;
  limits.vocab_size = static_cast<int32_t>(model_->config().vocab_size);
  limits.require_behavior_logprobs = o.trainer.loss.objective == Objective::kGrpo;
  return ValidateBatchLimits(limits);
}

absl::Status LearnerCore::BuildTrainer(WeightPublisher* publisher) {
  TrainerOptions t = options_.trainer;
  t.step_groups = options_.prompts_per_step;   // a short step weighs its groups as a full one
  t.publish_every = options_.broadcast_every;  // SyncRanks: rank 0's on every rank
  ASYMPO_ASSIGN_OR_RETURN(trainer_, Trainer::Create(std::move(t), model_.get(), publisher));
  return absl::OkStatus();
}

absl::Status LearnerCore::SyncRanks() {
  if (dp_ == nullptr) return absl::OkStatus();
  uint64_t version = trainer_->version();
  const DistShard shard = options_.data_parallel.shard;
  ASYMPO_RETURN_IF_ERROR(dp_->BroadcastState(model_.get(), &trainer_->optimizer(), &version,
                                             /*moments=*/shard == DistShard::kNone));
  trainer_->set_version(version);
  // Every rank reads the weights of the same versions (fully sharded, the
  // unit gathers are collectives): rank 0's --broadcast_every holds.
  std::vector<int64_t> agreed{options_.broadcast_every};
  ASYMPO_RETURN_IF_ERROR(dp_->BroadcastValues(&agreed));
  if (agreed[0] != options_.broadcast_every) {
    LOG(WARNING) << "--broadcast_every=" << options_.broadcast_every << " on this rank; rank 0's, "
                 << agreed[0] << ", holds";
  }
  trainer_->set_publish_every(agreed[0]);
  if (shard == DistShard::kOptimizer) {
    ASYMPO_RETURN_IF_ERROR(trainer_->ShardOptimizer(dp_.get()));
    LOG(INFO) << "ZeRO-1: this rank keeps " << trainer_->optimizer_state_bytes() / (1 << 20)
              << " MiB of AdamW moments, 1/" << dp_->world_size() << " of them";
  } else if (shard == DistShard::kFull) {
    ASYMPO_RETURN_IF_ERROR(trainer_->ShardFully(dp_.get()));
    const FullShard& f = *trainer_->full_shard();
    LOG(INFO) << "full sharding: this rank keeps " << f.weight_bytes() / (1 << 20)
              << " MiB of master weights and as much of gradients, " << f.state_bytes() / (1 << 20)
              << " MiB of AdamW moments (1/" << dp_->world_size() << " of each, in " << f.units()
              << " units; the largest, " << f.largest_unit() * 4 / (1 << 20)
              << " MiB, is gathered whole when it runs)";
  }
  return absl::OkStatus();
}

CheckpointRanks LearnerCore::checkpoint_ranks() const {
  CheckpointRanks r;
  r.collectives = dp_.get();
  r.dist_shard = std::string(DistShardName(dp_ ? options_.data_parallel.shard : DistShard::kNone));
  return r;
}

absl::StatusOr<std::optional<CheckpointInfo>> LearnerCore::RestoreCheckpoint() {
  const std::string& dir = options_.checkpoint_dir;
  if (dir.empty()) return std::optional<CheckpointInfo>();
  ASYMPO_RETURN_IF_ERROR(CheckSharedCheckpointDir(dir, checkpoint_ranks()));
  ASYMPO_ASSIGN_OR_RETURN(
      std::optional<CheckpointInfo> info,
      LoadLatestCheckpoint(dir, *model_, &trainer_->stepper(), checkpoint_ranks()));
  if (info.has_value() && !base_.empty()) {  // rank 0, with adapters
    ASYMPO_RETURN_IF_ERROR(CheckSameBase(info->base, base_, info->path));
  }
  if (info.has_value()) {
    trainer_->set_version(info->version);
    LOG(INFO) << "rank " << (dp_ ? dp_->rank() : 0) << " read " << info->bytes_read / (1 << 20)
              << " MiB of " << info->path << " (written by " << info->written_by << " rank(s), "
              << info->written_shard << " sharding)";
  }
  return info;
}

absl::StatusOr<CheckpointInfo> LearnerCore::SaveCheckpoint(CheckpointSave save, bool alone) {
  save.root = options_.checkpoint_dir;
  save.version = trainer_->version();
  save.base = base_;
  CheckpointRanks ranks = checkpoint_ranks();
  if (alone) ranks = CheckpointRanks{};
  return ::asympo::learner::SaveCheckpoint(save, *model_, trainer_->stepper(), ranks);
}

WeightParts LearnerCore::weight_parts() {
  return [trainer = trainer_.get()](const StagePart& stage) {
    return trainer->VisitWeightParts(stage);
  };
}

absl::Status LearnerCore::ExportWeights() {
  const bool rank0 = dp_ == nullptr || dp_->rank() == 0;
  if (model_->has_adapters()) {
    // The base is whole on every rank; fully sharded, the adapters are small
    // enough to gather whole on rank 0 (a collective). Rank 0 writes the
    // merged model, and the adapters alone as PEFT writes them in adapter/.
    ASYMPO_RETURN_IF_ERROR(trainer_->stepper().GatherWeights());
    absl::Status s;
    if (rank0) {
      s = ExportPolicyModel(*model_, options_.export_dir, int64_t{5} << 30, options_.publish_dtype);
      if (s.ok()) s = ExportPeftAdapter(*model_, options_.export_dir + "/adapter", options_.model);
    }
    trainer_->stepper().ReleaseWeights();
    return s;
  }
  if (trainer_->full_shard() == nullptr) {  // rank 0 holds the whole weights
    if (!rank0) return absl::OkStatus();
    return ExportPolicyModel(*model_, options_.export_dir, int64_t{5} << 30,
                             options_.publish_dtype);
  }
  if (!rank0) return weight_parts()(StageNothing);
  return ExportPolicyModelInParts(*model_, options_.export_dir, options_.publish_dtype,
                                  weight_parts());
}

void LearnerCore::Progress() const {
  if (options_.on_progress) options_.on_progress();
}

}  // namespace asympo::learner
