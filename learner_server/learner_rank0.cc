#include "learner_server/learner_rank0.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/status_macros.h"
#include "learner_server/start_checks.h"
#include "learner_server/trainer/checkpoint.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<LearnerRank0>> LearnerRank0::Create(LearnerDaemonOptions o,
                                                                   prometheus::Registry& registry) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<LearnerCore> core, LearnerCore::Create(std::move(o)));
  std::unique_ptr<LearnerRank0> d(new LearnerRank0(std::move(core)));
  LearnerCore& c = *d->core_;
  d->incarnation_ = NewIncarnation();
  // Found before the model is built.
  ASYMPO_ASSIGN_OR_RETURN(d->security_, SetUpLearnerSecurity(&c.options(), registry));
  ASYMPO_RETURN_IF_ERROR(c.JoinRanks());
  // Found at start, not at the first checkpoint.
  ASYMPO_RETURN_IF_ERROR(CheckWritableDir(c.options().checkpoint_dir, "checkpoint_dir"));
  ASYMPO_RETURN_IF_ERROR(CheckWritableDir(c.options().export_dir, "export_dir"));
  ASYMPO_RETURN_IF_ERROR(c.BuildModel());
  ASYMPO_RETURN_IF_ERROR(d->BuildPublisher(registry));
  ASYMPO_RETURN_IF_ERROR(c.BuildTrainer(d->publisher_.get()));
  ASYMPO_RETURN_IF_ERROR(c.SyncRanks());           // every rank starts from these weights
  ASYMPO_RETURN_IF_ERROR(d->RestoreCheckpoint());  // each rank its part
  d->store_->SetIncarnation(d->incarnation_, d->resumed_from_);
  LOG(INFO) << "incarnation " << d->incarnation_;
  // Late joiners and restarted rollouts get the current weights at once.
  // Fully sharded, every rank joins the unit gathers.
  ASYMPO_RETURN_IF_ERROR(d->publisher_->PublishNow(c.version(), c.model(), c.weight_parts()));
  ASYMPO_ASSIGN_OR_RETURN(d->step_log_,
                          StepLog::Open(c.options().step_csv_path, c.options().log_every));
  d->watch_ =
      std::make_unique<ProgressWatch>(c.options().ready_stall_timeout, c.options().prompts_per_step,
                                      absl::Now(), c.options().partial_step_after);
  ASYMPO_RETURN_IF_ERROR(d->StartServer(registry));
  return d;
}

LearnerRank0::~LearnerRank0() {
  Shutdown();
  endpoint_.reset();  // the server, before what it serves
}

absl::Status LearnerRank0::BuildPublisher(prometheus::Registry& registry) {
  const LearnerDaemonOptions& o = options();
  const PolicyModel& model = core_->model();
  metrics_ = std::make_unique<LearnerMetrics>(registry, RewardMonitorOptionsOf(o));
  skipped_ = std::make_unique<SkippedSteps>(RegisterSkippedStepCounters(registry));
  quarantine_ =
      std::make_unique<SourceQuarantine>(o.quarantine, RegisterQuarantineCounters(registry));
  policy_lag_ = std::make_unique<PolicyLag>(o.max_policy_lag, RegisterPolicyLagMetrics(registry));
  broadcast::SnapshotStoreOptions store = o.snapshots;
  store.incarnation = incarnation_;
  store_ = std::make_unique<broadcast::SnapshotStore>(
      std::move(store), broadcast::ModelSignatureOf(model, o.publish_dtype), registry);
  broadcast::BroadcastSenderOptions bo = o.broadcast;
  bo.received_bytes = &received_bytes_;
  sender_ = std::make_unique<broadcast::BroadcastSender>(std::move(bo), *store_, registry);
  // With the NCCL transport or an NCCL weight group, and the model on a
  // GPU, NCCL broadcasts from the staged device copy.
  const bool on_gpu = model.options().device.is_cuda();
  const bool device_buckets = NcclFromDeviceCopy(o) && on_gpu;
  if (sender_->nccl_configured() && on_gpu && o.snapshot_staging_host) {
    return absl::InvalidArgumentError(
        "--snapshot_staging=host cannot feed the NCCL transport (--broadcast_nccl_world_size), "
        "which broadcasts from the device copy: use --snapshot_staging=device");
  }
  ASYMPO_ASSIGN_OR_RETURN(
      publisher_, SnapshotPublisher::Create(store_.get(), model, o.publish_dtype,
                                            RegisterSnapshotCounters(registry), device_buckets,
                                            o.snapshot_staging_host));
  if (o.weight_group_enabled) {
    broadcast::WeightGroupOptions wo = o.weight_group;
    wo.authorizer = security_.authorizer.get();
    wo.received_bytes = &received_bytes_;
    if (wo.backend == "nccl" && model.options().device.is_cuda()) {
      wo.nccl_device = std::max(0, int{model.options().device.index()});
    }
    ASYMPO_ASSIGN_OR_RETURN(weight_group_,
                            broadcast::WeightGroup::Create(std::move(wo), *store_, registry));
  }
  return absl::OkStatus();
}

absl::Status LearnerRank0::RestoreCheckpoint() {
  const std::string& dir = options().checkpoint_dir;
  if (dir.empty()) return absl::OkStatus();
  ASYMPO_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> ckpt, core_->RestoreCheckpoint());
  if (!ckpt.has_value()) {
    LOG(INFO) << "no checkpoint under " << dir << "; starting from version 0";
    return absl::OkStatus();
  }
  metrics_->OnCheckpoint(ckpt->version);
  restored_batches_ = std::move(ckpt->batches);
  // The reward peaks it had: a collapsed reward is not the new peak.
  if (!ckpt->reward_monitor.empty()) {
    if (absl::Status s = metrics_->RestoreRewards(ckpt->reward_monitor); !s.ok()) {
      LOG(WARNING) << ckpt->path << "/meta.json: " << s.message()
                   << "; the reward EMAs and their peaks start afresh";
    }
  }
  counters_.checkpoint_version.store(ckpt->version);
  resumed_from_ = ckpt->version;
  LOG(INFO) << "resumed from " << ckpt->path << " at version " << ckpt->version << " ("
            << restored_batches_.size() << " trained batch ids remembered)";
  return absl::OkStatus();
}

absl::Status LearnerRank0::StartServer(prometheus::Registry& registry) {
  const LearnerDaemonOptions& o = options();
  GroupQueueOptions qo = o.queue;
  qo.step_groups = o.prompts_per_step;  // no waiting batch holds up a step that others can fill
  queue_ = std::make_unique<GroupQueue>(qo);
  queue_->RestoreBatches(restored_batches_);
  intake_ = std::make_unique<StepIntake>(queue_.get(), policy_lag_.get(), o.partial_step_after);
  admission_watch_ =
      std::make_unique<AdmissionWatch>(registry, o.prompts_per_step, o.partial_step_after);
  restored_batches_.clear();
  LearnerServiceOptions so = o.service;
  so.authorizer = security_.authorizer.get();
  so.objective = std::string(ObjectiveName(o.trainer.loss.objective));
  so.version = [core = core_.get()] { return core->version(); };
  counters_.counted_version.store(core_->version());
  so.model_signature = store_->model_signature();
  so.received_bytes = &received_bytes_;
  so.quarantine = quarantine_.get();
  so.policy_lag = policy_lag_.get();
  so.incarnation = incarnation_;
  so.resumed_from_version = resumed_from_;
  ASYMPO_ASSIGN_OR_RETURN(
      endpoint_, LearnerEndpoint::Start(
                     o, security_,
                     std::make_unique<LearnerService>(so, queue_.get(), &counters_, metrics_.get()),
                     sender_.get(), registry, weight_group_.get()));
  metrics_->ObserveQueue(queue_->Stats());
  metrics_->SetVersion(core_->version());
  const PolicyModel& model = core_->model();
  const char* transport = o.tls.cert_file.empty()        ? "plaintext"
                          : o.tls.client_ca_file.empty() ? "TLS"
                                                         : "mTLS";
  LOG(INFO) << "learner serving on port " << port() << " (" << transport
            << (security_.authorizer->authenticates() ? ", callers authenticated"
                                                      : ", callers anonymous")
            << ", objective " << so.objective << ", model " << o.model << ", "
            << model.config().NumParameters() << " parameters on " << model.options().device << ", "
            << DTypeName(model.options().dtype) << " weights, " << DTypeName(model.compute_dtype())
            << " compute, broadcast as " << DTypeName(o.publish_dtype) << ", queue "
            << o.queue.capacity_groups << " groups)";
  return absl::OkStatus();
}

void LearnerRank0::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (queue_) queue_->Close();                   // refuses new batches, fails waiting ones
  if (sender_) sender_->Shutdown();              // ends the rollouts' subscriptions
  if (weight_group_) weight_group_->Shutdown();  // ends its waiting calls
}

absl::Status LearnerRank0::Checkpoint(bool alone) {
  absl::Status s = WriteCheckpoint(alone);
  if (!s.ok() && !IsRankFailure(s)) {
    metrics_->OnCheckpointFailure();
    LOG(ERROR) << "checkpoint failed: " << s.message();
  }
  return s;
}

absl::Status LearnerRank0::WriteCheckpoint(bool alone) {
  const LearnerDaemonOptions& o = options();
  const int64_t what = (o.checkpoint_dir.empty() ? 0 : StepMessage::kSaveCheckpoint) |
                       (o.export_dir.empty() ? 0 : StepMessage::kSaveExport);
  if (what == 0) return absl::OkStatus();
  // Every rank writes its part of the checkpoint.
  if (core_->dp() != nullptr && !alone) ASYMPO_RETURN_IF_ERROR(core_->dp()->SendSave(what));
  if ((what & StepMessage::kSaveCheckpoint) != 0) {
    // Every batch answered below `through` (never above the checkpoint's
    // version: a batch answered at it after the save is not in it) is
    // resolved by the steps this checkpoint holds (only this thread
    // resolves groups).
    const uint64_t through = queue_->TrainedThrough(core_->version());
    CheckpointSave save;
    save.config = o.config_text;
    save.keep_last = o.keep_checkpoints;
    save.batches = queue_->RecordedBatches();
    save.reward_monitor = metrics_->rewards().ToJson();
    ASYMPO_ASSIGN_OR_RETURN(CheckpointInfo info, core_->SaveCheckpoint(std::move(save), alone));
    metrics_->OnCheckpoint(info.version);
    counters_.checkpoint_version.store(info.version);
    counters_.recorded_through_version.store(through);
    LOG(INFO) << "checkpoint " << info.path;
  }
  if ((what & StepMessage::kSaveExport) != 0) {
    ASYMPO_RETURN_IF_ERROR(core_->ExportWeights());
    LOG(INFO) << "exported the policy to " << o.export_dir;
  }
  return absl::OkStatus();
}

bool LearnerRank0::TrainOneStep(int64_t* steps, int64_t* untrained) {
  // Only this thread moves the version: the next step trains from it.
  TakenGroups taken = intake_->Take(options().prompts_per_step, core_->version(),
                                    absl::Now() + absl::Milliseconds(200));
  if (stopping_.load()) {
    *untrained += static_cast<int64_t>(taken.groups.size());
    return false;
  }
  if (taken.groups.empty()) {
    metrics_->ObserveQueue(taken.queue);  // no step refreshes them while none is taken
    admission_watch_->OnNoStep(taken.queue);
    // The other ranks wait for every message within the timeout.
    if (core_->dp() != nullptr) {
      if (absl::Status s = core_->dp()->SendIdle(); !s.ok()) Fail(std::move(s));
    }
    return failure_.ok();
  }
  const int64_t n = static_cast<int64_t>(taken.groups.size());
  if (taken.short_step) admission_watch_->OnShortStep(n);
  std::vector<SourceReward> rewards = GroupRewards(taken.groups);
  absl::SleepFor(options().fault_step_delay);  // testing only: a stuck step
  StepOr<StepResult> step = core_->dp() != nullptr ? StepAcrossRanks(taken.groups)
                                                   : core_->trainer().Step(std::move(taken.groups));
  if (!step.ok()) {
    if (IsRankFailure(step.status())) {
      *untrained += n;
      Fail(step.status());
      return false;
    }
    skipped_->Record(step.failure(), n);
    counters_.skipped_groups.fetch_add(static_cast<uint64_t>(n));
    intake_->Skipped(taken);
    if (step.reason() == SkipReason::kPoisonedGroups) {
      // One source's poison, not the learner's failure: it does not count
      // toward --max_consecutive_skipped_steps; the quarantine stops it.
      DropPoisoned(taken.sources, /*counted=*/true);
      return true;
    }
    return !TooManySkipped(step.status());
  }
  skipped_in_a_row_ = 0;
  if (!step->dropped_sources.empty()) DropPoisoned(step->dropped_sources);
  // As the staleness: a data-parallel step's `dropped` indexes rank 0's shard.
  const std::vector<size_t> dropped =
      core_->dp() == nullptr ? step->dropped : std::vector<size_t>{};
  intake_->Trained(taken, dropped);
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) {
    if (*it < rewards.size()) rewards.erase(rewards.begin() + static_cast<ptrdiff_t>(*it));
  }
  ++*steps;
  return AfterStep(*steps, *step, rewards);
}

bool LearnerRank0::AfterStep(int64_t steps, const StepResult& step,
                             const std::vector<SourceReward>& rewards) {
  counters_.steps.fetch_add(1);
  counters_.trained_groups.fetch_add(static_cast<uint64_t>(step.diagnostics.groups));
  counters_.counted_version.store(step.version);  // after the counts: GetStatus pairs them
  const GroupQueueStats q = queue_->Stats();
  metrics_->ObserveStep(step, q, rewards);
  metrics_->ObserveSources(queue_->HeldBySource());
  step_log_->Write(steps, counters_.steps.load(), step, q, metrics_->collapse().suspected());
  const int64_t every = options().checkpoint_every;
  if (every > 0 && step.version % static_cast<uint64_t>(every) == 0) {
    absl::Status s = Checkpoint();
    if (IsRankFailure(s)) {
      Fail(std::move(s));
      return false;
    }
  }
  return true;
}

void LearnerRank0::DropPoisoned(const std::vector<std::string>& sources, bool counted) {
  if (!counted) counters_.skipped_groups.fetch_add(sources.size());
  const QuarantineOptions& q = options().quarantine;
  const absl::Time now = absl::Now();
  for (const std::string& source : sources) {
    if (int64_t held_back = 0; poisoned_log_.Allow(&held_back, now)) {
      LOG(WARNING) << "a group of source " << QuoteForMessage(source)
                   << " made the step's loss or gradient non-finite by itself and was dropped "
                      "(asympo_learner_poisoned_groups_total)"
                   << poisoned_log_.HeldBack(held_back);
    }
    if (quarantine_->RecordPoisoned(source, 1, now)) {
      LOG(WARNING) << "source " << QuoteForMessage(source) << " sent " << q.max_poisoned_groups
                   << " poisoned groups within " << absl::FormatDuration(q.window)
                   << "; its batches are refused for " << absl::FormatDuration(q.duration);
    }
  }
}

bool LearnerRank0::TooManySkipped(const absl::Status& last) {
  const int64_t limit = options().max_consecutive_skipped_steps;
  if (limit <= 0 || ++skipped_in_a_row_ < limit) return false;
  Fail(absl::FailedPreconditionError(absl::StrCat(
      skipped_in_a_row_, " training steps in a row were skipped (the last: ", last.message(),
      "); the learner stops rather than take groups it cannot train on. The weights of version ",
      core_->version(),
      " are kept; see the skipped-step log lines and "
      "--max_consecutive_skipped_steps")));
  return true;
}

StepOr<StepResult> LearnerRank0::StepAcrossRanks(const std::vector<QueuedGroup>& groups) {
  DataParallel* dp = core_->dp();
  absl::StatusOr<StepMessage> own = dp->SendStep(groups);
  if (!own.ok()) return own.status();  // a rank failure
  StepOr<StepResult> step = core_->trainer().StepShard(own->shard, own->totals, dp);
  // StepShard leaves the staleness to the caller: over every rank's groups.
  if (step.ok()) step->staleness = StalenessOf(groups, step->version - 1);
  return step;
}

void LearnerRank0::Fail(absl::Status status) {
  LOG(ERROR) << status.message() << "; stopping the job"
             << (core_->sharded()
                     ? " (the optimizer state is spread over the ranks: the newest checkpoint "
                       "stands)"
                     : " (rank 0 keeps its last step's weights)");
  if (failure_.ok()) failure_ = std::move(status);
  Shutdown();
}

absl::StatusOr<int64_t> LearnerRank0::Run() {
  int64_t steps = 0, untrained = 0;
  while (TrainOneStep(&steps, &untrained)) {
    core_->Progress();
    watch_->CameRound(queue_->Stats(), absl::Now());
    if (options().max_steps > 0 && steps >= options().max_steps) {
      Shutdown();
      break;
    }
  }
  endpoint_->Stop(absl::Seconds(5));
  untrained += queue_->depth_groups();
  // After a rank failure a sharded optimizer's state cannot be assembled,
  // and its weights may be half-updated: no checkpoint then. Unsharded,
  // rank 0 holds everything and writes it alone.
  const bool ranks_lost = !failure_.ok() && IsRankFailure(failure_) && core_->dp() != nullptr;
  absl::Status s = !failure_.ok() && core_->sharded() ? absl::OkStatus() : Checkpoint(ranks_lost);
  if (core_->dp() != nullptr && (failure_.ok() || !IsRankFailure(failure_))) {  // ranks alive
    if (absl::Status stop = core_->dp()->SendStop(); !stop.ok()) LOG(ERROR) << stop.message();
  }
  LOG(INFO) << "stopped after " << steps << " steps at version " << core_->version() << "; "
            << untrained << " queued groups were left untrained";
  if (!failure_.ok()) return failure_;
  if (!s.ok()) return s;
  return steps;
}

}  // namespace asympo::learner
