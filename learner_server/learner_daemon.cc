#include "learner_server/learner_daemon.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "common/listener/grpc_listener.h"
#include "common/listener/host_port.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/security/call_gate.h"
#include "common/status_macros.h"
#include "learner_server/checkpoint.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::learner {

namespace {

absl::Status ValidateOptions(const LearnerDaemonOptions& o) {
  if (o.prompts_per_step <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompts_per_step is ", o.prompts_per_step, "; it must be positive"));
  }
  if (o.queue.capacity_groups < o.prompts_per_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue capacity ", o.queue.capacity_groups, " is below prompts_per_step ",
                     o.prompts_per_step, "; a step could never be filled"));
  }
  if (o.service.limits.max_groups_per_batch > o.queue.capacity_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_groups_per_batch ", o.service.limits.max_groups_per_batch,
                     " exceeds the queue capacity ", o.queue.capacity_groups,
                     "; such a batch could never be queued"));
  }
  if (o.queue.batch_id_window < o.queue.capacity_groups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_id_window ", o.queue.batch_id_window, " is below the queue capacity ",
        o.queue.capacity_groups, "; every batch with a queued group must be remembered"));
  }
  if (o.max_connections < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections is ", o.max_connections, "; it must be >= 0 (0: default)"));
  }
  if (o.broadcast_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast_every is ", o.broadcast_every, "; it must be >= 0"));
  }
  ASYMPO_RETURN_IF_ERROR(ValidateCollapseOptions(o.collapse));
  return ValidateTrainerOptions(o.trainer);
}

// Creates `dir` if needed and writes and removes a file in it.
absl::Status CheckWritableDir(const std::string& dir, absl::string_view option) {
  if (dir.empty()) return absl::OkStatus();
  const auto fail = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat(option, " ", dir, " cannot be written: ", why));
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail(ec.message());
  if (!std::filesystem::is_directory(dir)) return fail("not a directory");
  const std::string probe = absl::StrCat(dir, "/.asympo-write-test-", ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) return fail(std::strerror(errno));
  const bool written = std::fputc('x', f) != EOF;
  const bool closed = std::fclose(f) == 0;
  std::remove(probe.c_str());
  if (!written || !closed) return fail("a file in it cannot be written");
  return absl::OkStatus();
}

// Counts what the listener did with each connection.
std::function<void(GrpcListenerEvent)> CountConnections(const ConnectionCounters& counters) {
  prometheus::Counter* accepted = &counters.accepted;
  prometheus::Counter* at_limit = &counters.refused_at_limit;
  prometheus::Counter* no_fds = &counters.refused_no_descriptors;
  prometheus::Counter* at_peer_limit = &counters.refused_at_peer_limit;
  prometheus::Counter* unauthenticated = &counters.closed_unauthenticated;
  prometheus::Counter* errors = &counters.accept_errors;
  return [=](GrpcListenerEvent e) {
    switch (e) {
      case GrpcListenerEvent::kAccepted:
        accepted->Increment();
        break;
      case GrpcListenerEvent::kRefusedAtLimit:
        at_limit->Increment();
        break;
      case GrpcListenerEvent::kRefusedWithoutDescriptors:
        no_fds->Increment();
        break;
      case GrpcListenerEvent::kRefusedAtPeerLimit:
        at_peer_limit->Increment();
        break;
      case GrpcListenerEvent::kClosedUnauthenticated:
        unauthenticated->Increment();
        break;
      case GrpcListenerEvent::kDescriptorExhaustion:
      case GrpcListenerEvent::kOtherAcceptError:
        errors->Increment();
        break;
    }
  };
}

}  // namespace

LearnerDaemon::LearnerDaemon(LearnerDaemonOptions options) : options_(std::move(options)) {}

LearnerDaemon::~LearnerDaemon() {
  Shutdown();
  listener_.reset();  // before the server: gRPC would leak what it is handed after
  if (server_) server_->Shutdown(GrpcDeadline(absl::Seconds(2)));
  if (step_csv_ != nullptr) std::fclose(step_csv_);
}

absl::StatusOr<std::unique_ptr<LearnerDaemon>> LearnerDaemon::Create(
    LearnerDaemonOptions o, prometheus::Registry& registry) {
  ASYMPO_RETURN_IF_ERROR(ValidateOptions(o));
  std::unique_ptr<LearnerDaemon> d(new LearnerDaemon(std::move(o)));
  if (d->options_.data_parallel.rank == 0) {  // found before the model is built
    ASYMPO_RETURN_IF_ERROR(d->SetUpSecurity(registry));
  }
  if (d->options_.data_parallel.world_size > 1) {
    ASYMPO_ASSIGN_OR_RETURN(d->dp_, DataParallel::Create(d->options_.data_parallel));
  }
  if (!d->is_worker()) {  // found at start, not at the first checkpoint
    ASYMPO_RETURN_IF_ERROR(CheckWritableDir(d->options_.checkpoint_dir, "checkpoint_dir"));
    ASYMPO_RETURN_IF_ERROR(CheckWritableDir(d->options_.export_dir, "export_dir"));
  }
  ASYMPO_RETURN_IF_ERROR(d->BuildModelAndTrainer(registry));
  if (!d->is_worker()) ASYMPO_RETURN_IF_ERROR(d->RestoreCheckpoint());
  if (d->dp_ != nullptr) {
    // Every rank starts from rank 0's weights, moments and version.
    uint64_t version = d->trainer_->version();
    const bool shard = d->options_.data_parallel.shard_optimizer;
    ASYMPO_RETURN_IF_ERROR(d->dp_->BroadcastState(d->model_.get(), &d->trainer_->optimizer(),
                                                  &version, /*moments=*/!shard));
    d->trainer_->set_version(version);
    if (shard) {
      ASYMPO_RETURN_IF_ERROR(d->trainer_->ShardOptimizer(d->dp_.get()));
      LOG(INFO) << "ZeRO-1: this rank keeps "
                << d->trainer_->sharded_optimizer()->state_bytes() / (1 << 20)
                << " MiB of AdamW moments, 1/" << d->dp_->world_size() << " of them";
    }
    if (d->is_worker()) return d;
  }
  // Late joiners and restarted rollouts get the current weights at once.
  ASYMPO_RETURN_IF_ERROR(d->publisher_->PublishNow(d->trainer_->version(), *d->model_));
  ASYMPO_RETURN_IF_ERROR(d->OpenStepCsv());
  d->start_time_ = absl::Now();
  ASYMPO_RETURN_IF_ERROR(d->StartServer(registry));
  return d;
}

absl::Status LearnerDaemon::SetUpSecurity(prometheus::Registry& registry) {
  LearnerDaemonOptions& o = options_;
  // asympo_tls_*: renewed files refused or taken.
  ASYMPO_ASSIGN_OR_RETURN(credentials_, security::MakeServerCredentials(o.tls, registry));
  o.auth.client_ca_file = o.tls.client_ca_file;
  ASYMPO_ASSIGN_OR_RETURN(authorizer_, security::Authorizer::Create(
                                           o.auth, RegisterRefusalCounters(registry), registry));
  // A malformed address is named as such, not refused as beyond loopback.
  ASYMPO_RETURN_IF_ERROR(SplitHostPort(o.listen_address, "--listen").status());
  ASYMPO_RETURN_IF_ERROR(security::CheckListenPolicy(o.listen_address, !o.tls.cert_file.empty(),
                                                     authorizer_->authenticates(), o.insecure));
  o.broadcast.authorizer = authorizer_.get();
  // Callers are authenticated on their headers, before gRPC reads a message.
  credentials_ = security::GateCallsOnMetadata(credentials_, !o.tls.cert_file.empty(),
                                               o.listen_address, authorizer_.get());
  if (!IsLoopbackAddress(o.listen_address) &&
      (o.tls.cert_file.empty() || !authorizer_->authenticates())) {
    LOG(WARNING) << "--insecure: listening on " << o.listen_address
                 << (o.tls.cert_file.empty() ? " in plaintext" : "")
                 << (authorizer_->authenticates() ? "" : " without client authentication")
                 << "; anyone who reaches the port can submit batches and read the weights";
  }
  return absl::OkStatus();
}

absl::Status LearnerDaemon::BuildModelAndTrainer(prometheus::Registry& registry) {
  const LearnerDaemonOptions& o = options_;
  ASYMPO_ASSIGN_OR_RETURN(model_,
                          CreateOrLoadPolicyModel(o.model, o.tiny_vocab_size, o.model_options));
  BatchLimits& limits = options_.service.limits;
  limits.vocab_size = static_cast<int32_t>(model_->config().vocab_size);
  limits.require_behavior_logprobs = o.trainer.loss.objective == Objective::kGrpo;
  ASYMPO_RETURN_IF_ERROR(ValidateBatchLimits(limits));
  metrics_ = std::make_unique<LearnerMetrics>(registry, o.collapse);
  skipped_ = std::make_unique<SkippedSteps>(RegisterSkippedStepCounters(registry));
  ASYMPO_RETURN_IF_ERROR(ValidateQuarantineOptions(o.quarantine));
  quarantine_ =
      std::make_unique<SourceQuarantine>(o.quarantine, RegisterQuarantineCounters(registry));
  if (is_worker()) {  // no broadcast: rank 0 publishes
    ASYMPO_ASSIGN_OR_RETURN(trainer_, Trainer::Create(o.trainer, model_.get(), nullptr));
    return absl::OkStatus();
  }
  broadcast::BroadcastSenderOptions bo = o.broadcast;
  bo.received_bytes = &received_bytes_;
  sender_ = std::make_unique<broadcast::BroadcastSender>(
      std::move(bo), broadcast::ModelSignatureOf(*model_, o.publish_dtype), &registry);
  ASYMPO_ASSIGN_OR_RETURN(
      publisher_, SnapshotPublisher::Create(sender_.get(), *model_, o.publish_dtype,
                                            o.broadcast_every, RegisterSnapshotCounters(registry)));
  ASYMPO_ASSIGN_OR_RETURN(trainer_, Trainer::Create(o.trainer, model_.get(), publisher_.get()));
  return absl::OkStatus();
}

absl::Status LearnerDaemon::RestoreCheckpoint() {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  ASYMPO_ASSIGN_OR_RETURN(
      std::optional<CheckpointInfo> ckpt,
      LoadLatestCheckpoint(options_.checkpoint_dir, model_.get(), &trainer_->optimizer()));
  if (!ckpt.has_value()) {
    LOG(INFO) << "no checkpoint under " << options_.checkpoint_dir << "; starting from version 0";
    return absl::OkStatus();
  }
  trainer_->set_version(ckpt->version);
  metrics_->OnCheckpoint(ckpt->version);
  restored_batch_ids_ = std::move(ckpt->batch_ids);
  LOG(INFO) << "resumed from " << ckpt->path << " at version " << ckpt->version << " ("
            << restored_batch_ids_.size() << " trained batch ids remembered)";
  return absl::OkStatus();
}

absl::Status LearnerDaemon::OpenStepCsv() {
  if (options_.step_csv_path.empty()) return absl::OkStatus();
  step_csv_ = std::fopen(options_.step_csv_path.c_str(), "a");
  if (step_csv_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot open step_csv_path ", options_.step_csv_path, ": ", std::strerror(errno)));
  }
  if (std::ftell(step_csv_) == 0) {
    std::fputs(
        "time_s,step,version,reward_mean,reward_std,loss,s_pos,s_neg,grad_norm,lr,"
        "tokens_per_s,queue_depth,staleness_mean,mean_response_length\n",
        step_csv_);
    std::fflush(step_csv_);
  }
  return absl::OkStatus();
}

absl::Status LearnerDaemon::StartServer(prometheus::Registry& registry) {
  const LearnerDaemonOptions& o = options_;
  queue_ = std::make_unique<GroupQueue>(o.queue);
  queue_->RestoreBatchIds(restored_batch_ids_);
  restored_batch_ids_.clear();
  LearnerServiceOptions so = o.service;
  so.authorizer = authorizer_.get();
  so.objective = std::string(ObjectiveName(o.trainer.loss.objective));
  so.version = [trainer = trainer_.get()] { return trainer->version(); };
  so.model_signature = sender_->model_signature();
  so.received_bytes = &received_bytes_;
  so.quarantine = quarantine_.get();
  service_ = std::make_unique<LearnerService>(so, queue_.get(), &counters_, metrics_.get());
  grpc::ServerBuilder builder;
  // Our own listener: gRPC's stops accepting for good after one EMFILE
  // (common/grpc_listener.h).
  GrpcListenerOptions lo;
  lo.max_connections = o.max_connections;
  lo.max_connections_per_peer = o.max_connections_per_peer;
  lo.unauthenticated_grace = o.connection_auth_grace;
  const ConnectionCounters connections = RegisterConnectionCounters(registry);
  lo.on_event = CountConnections(connections);
  absl::StatusOr<std::unique_ptr<GrpcListener>> listener =
      GrpcListener::Bind(o.listen_address, credentials_, &builder, std::move(lo));
  const auto cannot_listen = [&](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", o.listen_address,
                     " (the port is in use, by another learner perhaps, or the address is not "
                     "one of this host's): ",
                     why));
  };
  if (absl::IsInvalidArgument(listener.status())) return listener.status();  // names the rule
  if (!listener.ok()) {
    return cannot_listen(absl::StripPrefix(
        listener.status().message(), absl::StrCat("cannot listen on ", o.listen_address, ": ")));
  }
  listener_ = *std::move(listener);
  authorizer_->SetOnAuthorized(listener_->authorized_hook());
  connections.max_connections.Set(listener_->max_connections());
  builder.RegisterService(service_.get());
  builder.RegisterService(sender_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(so.max_message_bytes));
  // Rollouts' weight receivers send keepalive pings every 20 s on their
  // announcement streams; allow them (and idle ones) without a GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) return cannot_listen("the gRPC server did not start");
  listener_->Start();
  port_ = listener_->port();
  metrics_->ObserveQueue(queue_->Stats());
  metrics_->SetVersion(trainer_->version());
  const char* transport = o.tls.cert_file.empty()        ? "plaintext"
                          : o.tls.client_ca_file.empty() ? "TLS"
                                                         : "mTLS";
  LOG(INFO) << "learner serving on port " << port_ << " (" << transport
            << (authorizer_->authenticates() ? ", callers authenticated" : ", callers anonymous")
            << ", objective " << so.objective << ", model " << o.model << ", "
            << model_->config().NumParameters() << " parameters on " << model_->options().device
            << ", " << DTypeName(model_->options().dtype) << " weights, "
            << DTypeName(model_->compute_dtype()) << " compute, broadcast as "
            << DTypeName(o.publish_dtype) << ", queue " << o.queue.capacity_groups << " groups)";
  return absl::OkStatus();
}

void LearnerDaemon::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (queue_) queue_->Close();       // refuses new batches, fails waiting ones
  if (sender_) sender_->Shutdown();  // ends the rollouts' subscriptions
}

void LearnerDaemon::WriteStepCsv(const StepResult& step, const GroupQueueStats& queue) {
  if (step_csv_ == nullptr) return;
  double staleness = 0;
  for (uint64_t s : step.staleness) staleness += static_cast<double>(s);
  if (!step.staleness.empty()) staleness /= static_cast<double>(step.staleness.size());
  const LossDiagnostics& d = step.diagnostics;
  std::fprintf(step_csv_, "%.3f,%lld,%llu,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.1f,%d,%.3f,%.3f\n",
               absl::ToDoubleSeconds(absl::Now() - start_time_),
               static_cast<long long>(counters_.steps.load()),
               static_cast<unsigned long long>(step.version), d.reward_mean, d.reward_std, d.loss,
               d.s_pos, d.s_neg, step.grad_norm, step.learning_rate,
               step.seconds > 0 ? static_cast<double>(step.tokens) / step.seconds : 0.0,
               static_cast<int>(queue.depth_groups), staleness, d.mean_response_length);
  std::fflush(step_csv_);
}

absl::Status LearnerDaemon::Checkpoint() {
  absl::Status s = WriteCheckpoint();
  if (!s.ok() && !IsRankFailure(s)) {
    metrics_->OnCheckpointFailure();
    LOG(ERROR) << "checkpoint failed: " << s.message();
  }
  return s;
}

absl::Status LearnerDaemon::WriteCheckpoint() {
  if (!options_.checkpoint_dir.empty()) {
    if (trainer_->sharded_optimizer() != nullptr) {  // the moments, from every rank
      ASYMPO_RETURN_IF_ERROR(dp_->SendGather());
      ASYMPO_RETURN_IF_ERROR(trainer_->GatherOptimizerState());
    }
    absl::StatusOr<CheckpointInfo> info =
        SaveCheckpoint(options_.checkpoint_dir, trainer_->version(), *model_, trainer_->optimizer(),
                       options_.config_text, options_.keep_checkpoints, queue_->TrainedBatchIds());
    trainer_->ReleaseOptimizerState();
    if (!info.ok()) return info.status();
    metrics_->OnCheckpoint(info->version);
    LOG(INFO) << "checkpoint " << info->path;
  }
  if (!options_.export_dir.empty()) {
    ASYMPO_RETURN_IF_ERROR(
        ExportPolicyModel(*model_, options_.export_dir, int64_t{5} << 30, options_.publish_dtype));
    LOG(INFO) << "exported the policy to " << options_.export_dir;
  }
  return absl::OkStatus();
}

void LearnerDaemon::LogStep(int64_t steps, const StepResult& step, const GroupQueueStats& q) {
  const absl::Time now = absl::Now();
  const bool collapse = metrics_->collapse().suspected();
  // A collapse suspicion that begins is logged at once, at most once an
  // interval too (the suspicion can come and go step by step).
  const bool collapse_begins =
      collapse && !logged_collapse_ && now - last_collapse_log_ >= options_.log_every;
  if (steps > 10 && now - last_step_log_ < options_.log_every && !collapse_begins) return;
  last_step_log_ = now;
  logged_collapse_ = collapse;
  if (collapse_begins) last_collapse_log_ = now;
  const LossDiagnostics& d = step.diagnostics;
  LOG(INFO) << absl::StrFormat(
      "step %d version %d reward %.4f loss %.5f S_P %.3f S_N %.3f grad %.3f lr %.2e "
      "tokens/s %.0f queue %d/%d%s",
      steps, step.version, d.reward_mean, d.loss, d.s_pos, d.s_neg, step.grad_norm,
      step.learning_rate, step.seconds > 0 ? step.tokens / step.seconds : 0.0, q.depth_groups,
      q.capacity_groups, metrics_->collapse().suspected() ? " COLLAPSE SUSPECTED" : "");
}

bool LearnerDaemon::TrainOneStep(int64_t* steps, int64_t* untrained) {
  std::vector<QueuedGroup> groups =
      queue_->Pop(options_.prompts_per_step, absl::Now() + absl::Milliseconds(200));
  if (stopping_.load()) {
    *untrained += static_cast<int64_t>(groups.size());
    return false;
  }
  if (groups.empty()) {
    // The other ranks wait for every message within the timeout.
    if (dp_ != nullptr) {
      if (absl::Status s = dp_->SendIdle(); !s.ok()) Fail(std::move(s));
    }
    return failure_.ok();
  }
  const int64_t n = static_cast<int64_t>(groups.size());
  std::vector<std::string> batch_ids, sources;
  for (const QueuedGroup& g : groups) {
    sources.push_back(g.source);
    if (!g.batch_id.empty() && (batch_ids.empty() || batch_ids.back() != g.batch_id)) {
      batch_ids.push_back(g.batch_id);
    }
  }
  absl::StatusOr<StepResult> step =
      dp_ != nullptr ? StepAcrossRanks(groups) : trainer_->Step(std::move(groups));
  if (!step.ok()) {
    if (IsRankFailure(step.status())) {
      *untrained += n;
      Fail(step.status());
      return false;
    }
    skipped_->Record(step.status(), n);
    counters_.skipped_groups.fetch_add(static_cast<uint64_t>(n));
    if (StepSkipReason(step.status()) == kSkipPoisonedGroups) {
      // One source's poison, not the learner's failure: it does not count
      // toward --max_consecutive_skipped_steps; the quarantine stops it.
      DropPoisoned(sources, /*counted=*/true);
      return true;
    }
    return !TooManySkipped(step.status());
  }
  skipped_in_a_row_ = 0;
  if (!step->dropped_sources.empty()) DropPoisoned(step->dropped_sources);
  queue_->MarkTrained(batch_ids);
  ++*steps;
  counters_.steps.fetch_add(1);
  counters_.trained_groups.fetch_add(static_cast<uint64_t>(step->diagnostics.groups));
  const GroupQueueStats q = queue_->Stats();
  metrics_->ObserveStep(*step, q);
  metrics_->ObserveSources(queue_->HeldBySource());
  WriteStepCsv(*step, q);
  LogStep(*steps, *step, q);
  if (options_.checkpoint_every > 0 &&
      step->version % static_cast<uint64_t>(options_.checkpoint_every) == 0) {
    absl::Status s = Checkpoint();
    if (IsRankFailure(s)) {
      Fail(std::move(s));
      return false;
    }
  }
  return true;
}

void LearnerDaemon::DropPoisoned(const std::vector<std::string>& sources, bool counted) {
  if (!counted) counters_.skipped_groups.fetch_add(sources.size());
  const absl::Time now = absl::Now();
  for (const std::string& source : sources) {
    if (int64_t held_back = 0; poisoned_log_.Allow(&held_back, now)) {
      LOG(WARNING) << "a group of source " << QuoteForMessage(source)
                   << " made the step's loss or gradient non-finite by itself and was dropped "
                      "(asympo_learner_poisoned_groups_total)"
                   << poisoned_log_.HeldBack(held_back);
    }
    if (quarantine_->RecordPoisoned(source, 1, now)) {
      LOG(WARNING) << "source " << QuoteForMessage(source) << " sent "
                   << options_.quarantine.max_poisoned_groups << " poisoned groups within "
                   << absl::FormatDuration(options_.quarantine.window)
                   << "; its batches are refused for "
                   << absl::FormatDuration(options_.quarantine.duration);
    }
  }
}

bool LearnerDaemon::TooManySkipped(const absl::Status& last) {
  const int64_t limit = options_.max_consecutive_skipped_steps;
  if (limit <= 0 || ++skipped_in_a_row_ < limit) return false;
  Fail(absl::FailedPreconditionError(absl::StrCat(
      skipped_in_a_row_, " training steps in a row were skipped (the last: ", last.message(),
      "); the learner stops rather than take groups it cannot train on. The weights of version ",
      trainer_->version(),
      " are kept; see the skipped-step log lines and "
      "--max_consecutive_skipped_steps")));
  return true;
}

absl::StatusOr<StepResult> LearnerDaemon::StepAcrossRanks(const std::vector<QueuedGroup>& groups) {
  ASYMPO_ASSIGN_OR_RETURN(StepMessage own, dp_->SendStep(groups));
  ASYMPO_ASSIGN_OR_RETURN(StepResult step, trainer_->StepShard(own.shard, own.totals, dp_.get()));
  step.staleness.clear();  // over every rank's groups, not rank 0's share
  for (const QueuedGroup& q : groups) {
    step.staleness.push_back(step.version - 1 - q.arrival_version);
  }
  return step;
}

void LearnerDaemon::Fail(absl::Status status) {
  LOG(ERROR) << status.message() << "; stopping the job"
             << (trainer_->sharded_optimizer() != nullptr
                     ? " (the optimizer state is spread over the ranks: the newest checkpoint "
                       "stands)"
                     : " (rank 0 keeps its last step's weights)");
  if (failure_.ok()) failure_ = std::move(status);
  Shutdown();
}

absl::StatusOr<int64_t> LearnerDaemon::RunWorker() {
  int64_t steps = 0;
  while (true) {
    ASYMPO_ASSIGN_OR_RETURN(StepMessage m, dp_->Receive());
    if (options_.on_progress) options_.on_progress();
    if (m.kind == StepMessage::Kind::kIdle) continue;
    if (m.kind == StepMessage::Kind::kStop) break;
    if (m.kind == StepMessage::Kind::kGather) {
      ASYMPO_RETURN_IF_ERROR(trainer_->GatherOptimizerState());
      continue;
    }
    absl::StatusOr<StepResult> step = trainer_->StepShard(m.shard, m.totals, dp_.get());
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
  LOG(INFO) << "rank " << dp_->rank() << " stopped with rank 0 after " << steps
            << " steps at version " << trainer_->version();
  return steps;
}

absl::StatusOr<int64_t> LearnerDaemon::Run() {
  if (is_worker()) return RunWorker();
  int64_t steps = 0, untrained = 0;
  while (TrainOneStep(&steps, &untrained)) {
    if (options_.on_progress) options_.on_progress();
    if (options_.max_steps > 0 && steps >= options_.max_steps) {
      Shutdown();
      break;
    }
  }
  server_->Shutdown(GrpcDeadline(absl::Seconds(5)));
  untrained += queue_->Stats().depth_groups;
  // After a rank failure a sharded optimizer's state cannot be assembled,
  // and its weights may be half-updated: no checkpoint then.
  const bool sharded = trainer_->sharded_optimizer() != nullptr;
  absl::Status s = failure_.ok() || !sharded ? Checkpoint() : absl::OkStatus();
  if (dp_ != nullptr && (failure_.ok() || !IsRankFailure(failure_))) {  // the ranks are alive
    if (absl::Status stop = dp_->SendStop(); !stop.ok()) LOG(ERROR) << stop.message();
  }
  LOG(INFO) << "stopped after " << steps << " steps at version " << trainer_->version() << "; "
            << untrained << " queued groups were left untrained";
  if (!failure_.ok()) return failure_;
  if (!s.ok()) return s;
  return steps;
}

}  // namespace asympo::learner
