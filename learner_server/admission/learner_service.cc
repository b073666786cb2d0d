#include "learner_server/admission/learner_service.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/wire/raw_messages.h"
#include "learner_server/admission/policy_lag.h"

namespace asympo::learner {
namespace {

constexpr char kAcceptedBatchesKey[] = "asympo-accepted-batches";

// The earlier of now + timeout and the client's deadline.
absl::Time SubmitDeadline(const grpc::CallbackServerContext* ctx, absl::Duration timeout) {
  const absl::Time own = absl::Now() + timeout;
  const auto client = ctx->deadline();
  if (client == std::chrono::system_clock::time_point::max()) return own;
  return std::min(own, absl::FromChrono(client));
}

// Counts one finished batch in counters and metrics.
void Account(const LearnerService& svc, const std::string& source, const AdmissionResult& r,
             const BatchCounts& c) {
  LearnerCounters* k = svc.counters();
  switch (r.outcome()) {
    case AdmissionOutcome::kAccepted:
      k->accepted_batches.fetch_add(1);
      k->accepted_groups.fetch_add(static_cast<uint64_t>(c.groups));
      k->accepted_responses.fetch_add(static_cast<uint64_t>(c.responses));
      break;
    case AdmissionOutcome::kDuplicate:
      k->duplicate_batches.fetch_add(1);
      break;
    case AdmissionOutcome::kQuota:
      k->rejected_quota_batches.fetch_add(1);
      svc.CountRefusal("RESOURCE_EXHAUSTED", std::string(QuotaLabel(r.quota())));
      break;
    case AdmissionOutcome::kPolicyLag:
      if (svc.options().policy_lag != nullptr) svc.options().policy_lag->CountRefused(source);
      break;
    case AdmissionOutcome::kInvalid:
    case AdmissionOutcome::kBatchIdConflict:
      k->rejected_invalid_batches.fetch_add(1);
      break;
    case AdmissionOutcome::kFull:
      k->rejected_full_batches.fetch_add(1);
      break;
    case AdmissionOutcome::kUnavailable:
    case AdmissionOutcome::kCancelled:
      break;
  }
  if (svc.observer() != nullptr) {
    svc.observer()->OnBatch(source, std::string(OutcomeLabel(r.outcome())), c.groups, c.responses,
                            c.prompt_tokens + c.response_tokens);
  }
}

void AddRetryAfter(grpc::CallbackServerContext* ctx, absl::Duration hint) {
  ctx->AddTrailingMetadata(kRetryAfterMetadataKey, std::to_string(absl::ToInt64Milliseconds(hint)));
}

// RESOURCE_EXHAUSTED carries a retry hint: the refusal's own (a rate's or
// a quarantine's wait), else the service's.
void AddRetryHint(grpc::CallbackServerContext* ctx, const AdmissionResult& r,
                  absl::Duration default_hint) {
  if (r.status().code() == absl::StatusCode::kResourceExhausted) {
    AddRetryAfter(ctx, r.retry_after().value_or(default_hint));
  }
}

// The queue ticket of a reactor's waiting push, so that a cancelled RPC
// withdraws it. A push may complete on another thread before PushAsync has
// even returned, hence the push counts.
class PushTracker {
 public:
  uint64_t Begin() {
    absl::MutexLock lock(&mu_);
    return ++started_;
  }
  // PushAsync returned `ticket` for push number `n`.
  void Waiting(uint64_t n, uint64_t ticket, GroupQueue* queue) {
    {
      absl::MutexLock lock(&mu_);
      if (ticket == 0 || completed_ >= n) return;
      ticket_ = ticket;
      if (!cancelled_) return;
    }
    queue->CancelPush(ticket);
  }
  void Completed() {
    absl::MutexLock lock(&mu_);
    completed_ = started_;
    ticket_ = 0;
  }
  void Cancel(GroupQueue* queue) {
    uint64_t ticket;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      ticket = ticket_;
    }
    if (ticket != 0) queue->CancelPush(ticket);
  }

 private:
  absl::Mutex mu_;
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// The checks before a batch is pushed: the source's quarantine, the wire,
// validation and the source's rate. kAccepted with `groups` ready to push.
AdmissionResult PrepareForPush(const LearnerService& svc, const grpc::ByteBuffer& raw,
                               const security::Principal& p, std::vector<QueuedGroup>* groups,
                               BatchCounts* counts) {
  AdmissionResult r = svc.AdmitSource(p);
  if (r.accepted()) r = svc.Prepare(raw, p.name, groups, counts);
  if (r.accepted()) r = svc.AdmitRate(p, counts->groups);
  return r;
}

// Submit: one batch; finishes when the queue admits or refuses it.
class SubmitReactor final : public grpc::ServerUnaryReactor {
 public:
  SubmitReactor(const LearnerService* svc, grpc::CallbackServerContext* ctx,
                const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : svc_(svc), ctx_(ctx), response_(response) {
    CountReceived(svc_->options().received_bytes, *request);
    absl::StatusOr<const security::Principal*> p = svc_->Authorize(*ctx_, security::Role::kSubmit);
    if (!p.ok()) {
      Finish(ToGrpcStatus(p.status()));
      return;
    }
    source_ = (*p)->name;
    std::vector<QueuedGroup> groups;
    AdmissionResult r = PrepareForPush(*svc_, *request, **p, &groups, &counts_);
    if (!r.accepted()) {
      Complete(r);
      return;
    }
    charged_ = *p;  // the rate was taken: given back if the queue does not keep the groups
    const uint64_t n = push_.Begin();
    const uint64_t ticket = svc_->queue()->PushAsync(
        std::move(groups), SubmitDeadline(ctx_, svc_->options().full_queue_timeout),
        [this](const AdmissionResult& done) { Complete(done); }, svc_->SourceLimit(**p));
    push_.Waiting(n, ticket, svc_->queue());
  }

  void OnCancel() override { push_.Cancel(svc_->queue()); }
  void OnDone() override { delete this; }

 private:
  void Complete(const AdmissionResult& r) {
    push_.Completed();
    if (charged_ != nullptr && !r.accepted()) svc_->RefundRate(*charged_, counts_.groups);
    Account(*svc_, source_, r, counts_);
    const bool duplicate = r.outcome() == AdmissionOutcome::kDuplicate;
    if (r.acknowledged()) {  // a duplicate is answered as its first submission was
      v1::SubmitResponse reply;
      reply.set_accepted_batches(1);
      reply.set_accepted_groups(static_cast<uint64_t>(counts_.groups));
      reply.set_accepted_responses(static_cast<uint64_t>(counts_.responses));
      reply.set_duplicate_batches(duplicate ? 1 : 0);
      reply.set_recorded_duplicates(r.recorded() ? 1 : 0);
      reply.set_learner_version(svc_->version());
      reply.set_learner_incarnation(svc_->options().incarnation);
      reply.set_queue_depth_groups(static_cast<uint32_t>(svc_->queue()->depth_groups()));
      SerializeReply(reply, response_);
      const absl::Duration delay = svc_->options().fault_reply_delay;
      if (delay > absl::ZeroDuration() && !duplicate) {  // the reply of a queued batch is late
        std::thread([this, delay] {
          absl::SleepFor(delay);
          Finish(grpc::Status::OK);
        }).detach();
        return;
      }
      Finish(grpc::Status::OK);
      return;
    }
    AddRetryHint(ctx_, r, svc_->options().retry_after);
    Finish(ToGrpcStatus(r.status()));
  }

  const LearnerService* svc_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* response_;
  std::string source_;
  const security::Principal* charged_ = nullptr;  // whose rate the push took
  BatchCounts counts_;
  PushTracker push_;
};

// SubmitStream: reads one batch, queues it, and only then reads the next.
class StreamReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  StreamReactor(const LearnerService* svc, grpc::CallbackServerContext* ctx,
                grpc::ByteBuffer* response)
      : svc_(svc), ctx_(ctx), response_(response) {
    absl::StatusOr<const security::Principal*> p = svc_->Authorize(*ctx_, security::Role::kSubmit);
    if (!p.ok()) {
      End(ToGrpcStatus(p.status()));
      return;
    }
    share_key_ = security::ShareKey(svc_->options().authorizer, **p, *ctx_);
    if (absl::Status full = svc_->OpenStream(share_key_); !full.ok()) {
      svc_->CountRefusal("RESOURCE_EXHAUSTED", "streams");
      AddRetryAfter(ctx_, svc_->options().retry_after);
      End(ToGrpcStatus(full));
      return;
    }
    counted_ = true;
    principal_ = *p;
    reaped_ =
        svc_->reaper().Add(ctx_, svc_->options().stream_idle_timeout, absl::InfiniteDuration());
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    svc_->reaper().Touch(reaped_);
    if (!ok) {  // the client half-closed (every batch was queued), or the call ended
      if (svc_->reaper().Reaped(reaped_)) {
        End(grpc::Status(
            grpc::StatusCode::DEADLINE_EXCEEDED,
            absl::StrCat("no batch for ", FormatDuration(svc_->options().stream_idle_timeout),
                         "; the stream was closed")));
        return;
      }
      reply_.set_learner_version(svc_->version());
      reply_.set_learner_incarnation(svc_->options().incarnation);
      reply_.set_queue_depth_groups(static_cast<uint32_t>(svc_->queue()->depth_groups()));
      SerializeReply(reply_, response_);
      End(grpc::Status::OK);
      return;
    }
    CountReceived(svc_->options().received_bytes, raw_);
    std::vector<QueuedGroup> groups;
    counts_ = BatchCounts{};
    AdmissionResult r = PrepareForPush(*svc_, raw_, *principal_, &groups, &counts_);
    raw_.Clear();
    if (!r.accepted()) {
      Fail(r);
      return;
    }
    const uint64_t n = push_.Begin();
    const uint64_t ticket = svc_->queue()->PushAsync(
        std::move(groups), SubmitDeadline(ctx_, svc_->options().full_queue_timeout),
        [this](const AdmissionResult& done) { Queued(done); }, svc_->SourceLimit(*principal_));
    push_.Waiting(n, ticket, svc_->queue());
  }

  void OnCancel() override { push_.Cancel(svc_->queue()); }
  void OnDone() override {
    if (counted_ && !closed_) svc_->StreamClosed(share_key_);  // ended without End (it does not)
    svc_->reaper().Remove(reaped_);
    delete this;
  }

 private:
  // Finishes the stream. Its place is given back first, not in OnDone: the
  // client sees the stream end once Finish is called and may open another
  // at once; OnDone comes later.
  void End(const grpc::Status& status) {
    if (counted_ && !closed_) svc_->StreamClosed(share_key_);
    closed_ = true;
    Finish(status);
  }

  void Queued(const AdmissionResult& r) {
    push_.Completed();
    // Not kept (a duplicate, refused, withdrawn): its rate is given back.
    if (!r.accepted()) svc_->RefundRate(*principal_, counts_.groups);
    if (!r.acknowledged()) {
      Fail(r);
      return;
    }
    Account(*svc_, principal_->name, r, counts_);
    ++accepted_;
    if (r.outcome() == AdmissionOutcome::kDuplicate) {
      reply_.set_duplicate_batches(reply_.duplicate_batches() + 1);
    }
    if (r.recorded()) reply_.set_recorded_duplicates(reply_.recorded_duplicates() + 1);
    reply_.set_accepted_batches(accepted_);
    reply_.set_accepted_groups(reply_.accepted_groups() + static_cast<uint64_t>(counts_.groups));
    reply_.set_accepted_responses(reply_.accepted_responses() +
                                  static_cast<uint64_t>(counts_.responses));
    StartRead(&raw_);
  }

  void Fail(const AdmissionResult& r) {
    Account(*svc_, principal_->name, r, counts_);
    AddRetryHint(ctx_, r, svc_->options().retry_after);
    ctx_->AddTrailingMetadata(kAcceptedBatchesKey, std::to_string(accepted_));
    const absl::Status& s = r.status();
    End(ToGrpcStatus(absl::Status(s.code(), absl::StrCat("batch ", accepted_, ": ", s.message()))));
  }

  const LearnerService* svc_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* response_;
  grpc::ByteBuffer raw_;
  v1::SubmitResponse reply_;
  const security::Principal* principal_ = nullptr;
  uint64_t reaped_ = 0;  // the reaper's handle (0: not added)
  BatchCounts counts_;
  uint64_t accepted_ = 0;
  PushTracker push_;
  std::string share_key_;  // whose stream it is, for the per-principal limit
  bool counted_ = false;   // counted in the service's open streams
  bool closed_ = false;    // End gave the place back
};

}  // namespace

std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

LearnerService::LearnerService(LearnerServiceOptions options, GroupQueue* queue,
                               LearnerCounters* counters, SubmitObserver* observer)
    : options_(std::move(options)),
      queue_(queue),
      counters_(counters),
      observer_(observer),
      streams_(options_.max_streams, options_.max_streams_per_principal),
      rates_(options_.limits.max_groups_per_batch) {
  if (options_.incarnation.empty()) options_.incarnation = NewIncarnation();
}

int64_t LearnerService::open_streams() const {
  absl::MutexLock lock(&streams_mu_);
  return streams_.held();
}

absl::Status LearnerService::OpenStream(const std::string& key) const {
  absl::MutexLock lock(&streams_mu_);
  switch (streams_.Acquire(key)) {
    case KeyedLimit::kTaken:
      return absl::OkStatus();
    case KeyedLimit::kFullForKey:
      return absl::ResourceExhaustedError(
          absl::StrCat(QuoteForMessage(key), " holds ", streams_.per_key(),
                       " SubmitStreams open, its limit; close one, or use Submit"));
    case KeyedLimit::kFullInAll:
      break;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the learner has ", streams_.total(),
                   " SubmitStreams open, its limit; close one, or use Submit"));
}

void LearnerService::StreamClosed(const std::string& key) const {
  absl::MutexLock lock(&streams_mu_);
  streams_.Release(key);
}

absl::StatusOr<const security::Principal*> LearnerService::Authorize(
    const grpc::CallbackServerContext& ctx, security::Role role) const {
  return security::AuthorizeCall(options_.authorizer, ctx, role);
}

AdmissionResult LearnerService::AdmitSource(const security::Principal& p) const {
  if (options_.quarantine == nullptr) return AdmissionResult::Accepted();
  absl::Duration retry_after = options_.retry_after;
  absl::Status s = options_.quarantine->Admit(p.name, options_.clock->Now(), &retry_after);
  if (s.ok()) return AdmissionResult::Accepted();
  return AdmissionResult::OverQuota(QuotaCause::kQuarantined, std::move(s), retry_after);
}

AdmissionResult LearnerService::AdmitRate(const security::Principal& p, int64_t groups) const {
  absl::Duration retry_after = options_.retry_after;
  absl::Status s =
      rates_.Admit(p.name, p.groups_per_second, groups, options_.clock->Now(), &retry_after);
  if (s.ok()) return AdmissionResult::Accepted();
  return AdmissionResult::OverQuota(QuotaCause::kRate, std::move(s), retry_after);
}

int64_t LearnerService::SourceLimit(const security::Principal& p) const {
  if (p.queue_share >= 1.0) return 0;
  // At least one group, and at least one of the largest batches allowed.
  const auto share = static_cast<int64_t>(p.queue_share * static_cast<double>(queue_->capacity()));
  return std::max<int64_t>({share, 1, options_.limits.max_groups_per_batch});
}

void LearnerService::CountRefusal(const std::string& code, const std::string& cause) const {
  if (options_.authorizer != nullptr) options_.authorizer->CountRefusal(code, cause);
}

AdmissionResult LearnerService::Prepare(const grpc::ByteBuffer& raw, const std::string& source,
                                        std::vector<QueuedGroup>* groups,
                                        BatchCounts* counts) const {
  v1::RolloutBatch batch;
  absl::Status s = ParseRawBatch(raw, options_.limits, options_.max_message_bytes, &batch);
  if (!s.ok()) return RefusedWith(std::move(s));
  *counts = CountBatch(batch);
  AdmissionResult r = Prepare(&batch, groups);
  for (QueuedGroup& g : *groups) g.source = source;
  return r;
}

AdmissionResult LearnerService::Prepare(v1::RolloutBatch* batch,
                                        std::vector<QueuedGroup>* groups) const {
  if (absl::Status s = ValidateRolloutBatch(*batch, options_.limits); !s.ok()) {
    return RefusedWith(std::move(s));
  }
  const uint64_t version = this->version();
  AdmissionResult lag = CheckPolicyVersions(
      *batch, version, options_.policy_lag != nullptr ? options_.policy_lag->max_lag() : 0);
  if (!lag.accepted()) return lag;
  // Fields of a newer protocol (or padding) are not the learner's to keep:
  // the queue's memory bound counts token ids only (docs/protocol.md).
  batch->DiscardUnknownFields();
  // A batch id names one payload: the groups as sent, whatever the
  // learner keeps of them.
  const std::string digest = batch->batch_id().empty() ? "" : BatchDigest(batch->groups());
  groups->reserve(static_cast<size_t>(batch->groups_size()));
  for (v1::PromptGroup& g : *batch->mutable_groups()) {
    QueuedGroup q;
    q.arrival_version = version;
    q.batch_id = batch->batch_id();
    q.batch_digest = digest;
    q.batch_groups = batch->groups_size();
    q.batch_index = static_cast<int32_t>(groups->size());
    int64_t tokens = 0;
    for (const v1::Response& r : g.responses()) tokens += g.prompt_tokens_size() + r.tokens_size();
    q.tokens = tokens;
    // A learner that does not run grpo ignores behavior log-probs: drop them
    // rather than hold them in the queue.
    if (!options_.limits.require_behavior_logprobs) {
      for (v1::Response& r : *g.mutable_responses()) r.clear_behavior_logprobs();
    }
    q.group = std::move(g);
    groups->push_back(std::move(q));
  }
  return AdmissionResult::Accepted();
}

grpc::ServerUnaryReactor* LearnerService::Submit(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return new SubmitReactor(this, context, request, response);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* LearnerService::SubmitStream(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new StreamReactor(this, context, response);
}

grpc::ServerUnaryReactor* LearnerService::GetStatus(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  CountReceived(options_.received_bytes, *request);
  absl::StatusOr<const security::Principal*> p = Authorize(*context, security::Role::kStatus);
  v1::GetStatusRequest parsed;
  absl::Status s = p.ok() ? ParseRawRequest(*request, &parsed) : p.status();
  if (!s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  SerializeReply(Status(), response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

v1::LearnerStatus LearnerService::Status() const {
  v1::LearnerStatus status;
  v1::LearnerStatus* response = &status;
  const GroupQueueStats q = queue_->Stats();
  const LearnerCounters& k = *counters_;
  response->set_version(k.counted_version.load());
  response->set_steps(k.steps.load());
  response->set_queue_depth_groups(static_cast<uint32_t>(q.depth_groups));
  response->set_queue_capacity_groups(static_cast<uint32_t>(q.capacity_groups));
  response->set_accepted_batches(k.accepted_batches.load());
  response->set_rejected_invalid_batches(k.rejected_invalid_batches.load());
  response->set_rejected_full_batches(k.rejected_full_batches.load());
  response->set_rejected_quota_batches(k.rejected_quota_batches.load());
  response->set_accepted_groups(k.accepted_groups.load());
  response->set_trained_groups(k.trained_groups.load());
  response->set_duplicate_batches(k.duplicate_batches.load());
  response->set_skipped_groups(k.skipped_groups.load());
  response->set_batch_id_window(static_cast<uint64_t>(queue_->options().batch_id_window));
  response->set_incarnation(options_.incarnation);
  response->set_resumed_from_version(options_.resumed_from_version);
  response->set_checkpoint_version(k.checkpoint_version.load());
  response->set_recorded_through_version(k.recorded_through_version.load());
  response->set_trained_through_version(queue_->TrainedThrough(response->version()));
  response->set_objective(options_.objective);
  response->set_model_signature(options_.model_signature);
  response->set_wants_behavior_logprobs(options_.limits.require_behavior_logprobs);
  v1::BatchLimits* l = response->mutable_limits();
  l->set_vocab_size(options_.limits.vocab_size);
  l->set_min_group_size(options_.limits.min_group_size);
  l->set_max_group_size(options_.limits.max_group_size);
  l->set_max_prompt_tokens(options_.limits.max_prompt_tokens);
  l->set_max_response_tokens(options_.limits.max_response_tokens);
  l->set_max_groups_per_batch(options_.limits.max_groups_per_batch);
  l->set_max_batch_id_bytes(static_cast<int32_t>(kMaxBatchIdBytes));
  l->set_max_message_bytes(options_.max_message_bytes);
  l->set_max_abs_reward(options_.limits.max_abs_reward);
  if (options_.policy_lag != nullptr) options_.policy_lag->Fill(response);
  return status;
}

}  // namespace asympo::learner
