#include "learner_server/learner_service.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

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

std::string ResultOf(const absl::Status& s) {
  if (s.ok()) return "accepted";
  if (s.code() == absl::StatusCode::kAlreadyExists) return "duplicate";
  if (s.code() == absl::StatusCode::kInvalidArgument) return "invalid";
  if (s.code() == absl::StatusCode::kResourceExhausted) return "full";
  return "unavailable";
}

// Counts one finished batch in counters and metrics.
void Account(const LearnerService& svc, const absl::Status& s, const BatchCounts& c) {
  LearnerCounters* k = svc.counters();
  if (s.ok()) {
    k->accepted_batches.fetch_add(1);
    k->accepted_groups.fetch_add(static_cast<uint64_t>(c.groups));
    k->accepted_responses.fetch_add(static_cast<uint64_t>(c.responses));
  } else if (s.code() == absl::StatusCode::kInvalidArgument) {
    k->rejected_invalid_batches.fetch_add(1);
  } else if (s.code() == absl::StatusCode::kResourceExhausted) {
    k->rejected_full_batches.fetch_add(1);
  } else if (s.code() == absl::StatusCode::kAlreadyExists) {
    k->duplicate_batches.fetch_add(1);
  }
  if (svc.observer() != nullptr) {
    svc.observer()->OnBatch(ResultOf(s), c.groups, c.responses,
                            c.prompt_tokens + c.response_tokens);
  }
}

void AddRetryHint(grpc::CallbackServerContext* ctx, const absl::Status& s,
                  absl::Duration retry_after) {
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    ctx->AddTrailingMetadata(kRetryAfterMetadataKey,
                             std::to_string(absl::ToInt64Milliseconds(retry_after)));
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

// Submit: one batch; finishes when the queue admits or refuses it.
class SubmitReactor final : public grpc::ServerUnaryReactor {
 public:
  SubmitReactor(const LearnerService* svc, grpc::CallbackServerContext* ctx,
                const v1::RolloutBatch* request, v1::SubmitResponse* response)
      : svc_(svc), ctx_(ctx), response_(response) {
    v1::RolloutBatch batch = *request;
    counts_ = CountBatch(batch);
    std::vector<QueuedGroup> groups;
    absl::Status s = svc_->Prepare(&batch, &groups);
    if (!s.ok()) {
      Complete(s);
      return;
    }
    const uint64_t n = push_.Begin();
    const uint64_t ticket = svc_->queue()->PushAsync(
        std::move(groups), SubmitDeadline(ctx_, svc_->options().full_queue_timeout),
        [this](const absl::Status& st) { Complete(st); });
    push_.Waiting(n, ticket, svc_->queue());
  }

  void OnCancel() override { push_.Cancel(svc_->queue()); }
  void OnDone() override { delete this; }

 private:
  void Complete(const absl::Status& s) {
    push_.Completed();
    Account(*svc_, s, counts_);
    const bool duplicate = s.code() == absl::StatusCode::kAlreadyExists;
    if (s.ok() || duplicate) {  // a duplicate is answered as its first submission was
      response_->set_accepted_batches(1);
      response_->set_accepted_groups(static_cast<uint64_t>(counts_.groups));
      response_->set_accepted_responses(static_cast<uint64_t>(counts_.responses));
      response_->set_duplicate_batches(duplicate ? 1 : 0);
      response_->set_learner_version(svc_->version());
      response_->set_queue_depth_groups(static_cast<uint32_t>(svc_->queue()->Stats().depth_groups));
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
    AddRetryHint(ctx_, s, svc_->options().retry_after);
    Finish(ToGrpcStatus(s));
  }

  const LearnerService* svc_;
  grpc::CallbackServerContext* ctx_;
  v1::SubmitResponse* response_;
  BatchCounts counts_;
  PushTracker push_;
};

// SubmitStream: reads one batch, queues it, and only then reads the next.
class StreamReactor final : public grpc::ServerReadReactor<v1::RolloutBatch> {
 public:
  StreamReactor(const LearnerService* svc, grpc::CallbackServerContext* ctx,
                v1::SubmitResponse* response, bool refuse)
      : svc_(svc), ctx_(ctx), response_(response), counted_(!refuse) {
    if (refuse) {
      const absl::Status full = absl::ResourceExhaustedError(
          absl::StrCat("the learner has ", svc_->options().max_streams,
                       " SubmitStreams open, its limit; close one, or use Submit"));
      AddRetryHint(ctx_, full, svc_->options().retry_after);
      Finish(ToGrpcStatus(full));
      return;
    }
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed: every batch was queued
      response_->set_learner_version(svc_->version());
      response_->set_queue_depth_groups(static_cast<uint32_t>(svc_->queue()->Stats().depth_groups));
      End(grpc::Status::OK);
      return;
    }
    counts_ = CountBatch(batch_);
    std::vector<QueuedGroup> groups;
    absl::Status s = svc_->Prepare(&batch_, &groups);
    if (!s.ok()) {
      Fail(s);
      return;
    }
    const uint64_t n = push_.Begin();
    const uint64_t ticket = svc_->queue()->PushAsync(
        std::move(groups), SubmitDeadline(ctx_, svc_->options().full_queue_timeout),
        [this](const absl::Status& st) { Queued(st); });
    push_.Waiting(n, ticket, svc_->queue());
  }

  void OnCancel() override { push_.Cancel(svc_->queue()); }
  void OnDone() override {
    if (counted_ && !closed_) svc_->StreamClosed();  // ended without End (it does not)
    delete this;
  }

 private:
  // Finishes the stream. Its place is given back first, not in OnDone: the
  // client sees the stream end once Finish is called and may open another
  // at once; OnDone comes later.
  void End(const grpc::Status& status) {
    if (counted_ && !closed_) svc_->StreamClosed();
    closed_ = true;
    Finish(status);
  }

  void Queued(const absl::Status& s) {
    push_.Completed();
    const bool duplicate = s.code() == absl::StatusCode::kAlreadyExists;
    if (!s.ok() && !duplicate) {
      Fail(s);
      return;
    }
    Account(*svc_, s, counts_);
    ++accepted_;
    if (duplicate) response_->set_duplicate_batches(response_->duplicate_batches() + 1);
    response_->set_accepted_batches(accepted_);
    response_->set_accepted_groups(response_->accepted_groups() +
                                   static_cast<uint64_t>(counts_.groups));
    response_->set_accepted_responses(response_->accepted_responses() +
                                      static_cast<uint64_t>(counts_.responses));
    batch_.Clear();
    StartRead(&batch_);
  }

  void Fail(const absl::Status& s) {
    Account(*svc_, s, counts_);
    AddRetryHint(ctx_, s, svc_->options().retry_after);
    ctx_->AddTrailingMetadata(kAcceptedBatchesKey, std::to_string(accepted_));
    End(ToGrpcStatus(absl::Status(s.code(), absl::StrCat("batch ", accepted_, ": ", s.message()))));
  }

  const LearnerService* svc_;
  grpc::CallbackServerContext* ctx_;
  v1::SubmitResponse* response_;
  v1::RolloutBatch batch_;
  BatchCounts counts_;
  uint64_t accepted_ = 0;
  PushTracker push_;
  const bool counted_;   // counted in the service's open streams
  bool closed_ = false;  // End gave the place back
};

}  // namespace

LearnerService::LearnerService(LearnerServiceOptions options, GroupQueue* queue,
                               LearnerCounters* counters, SubmitObserver* observer)
    : options_(std::move(options)), queue_(queue), counters_(counters), observer_(observer) {}

absl::Status LearnerService::Prepare(v1::RolloutBatch* batch,
                                     std::vector<QueuedGroup>* groups) const {
  absl::Status s = ValidateRolloutBatch(*batch, options_.limits);
  if (!s.ok()) return s;
  // Fields of a newer protocol (or padding) are not the learner's to keep:
  // the queue's memory bound counts token ids only (docs/protocol.md).
  batch->DiscardUnknownFields();
  const uint64_t version = this->version();
  groups->reserve(static_cast<size_t>(batch->groups_size()));
  for (v1::PromptGroup& g : *batch->mutable_groups()) {
    QueuedGroup q;
    q.arrival_version = version;
    q.batch_id = batch->batch_id();
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
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* LearnerService::Submit(grpc::CallbackServerContext* context,
                                                 const v1::RolloutBatch* request,
                                                 v1::SubmitResponse* response) {
  return new SubmitReactor(this, context, request, response);
}

grpc::ServerReadReactor<v1::RolloutBatch>* LearnerService::SubmitStream(
    grpc::CallbackServerContext* context, v1::SubmitResponse* response) {
  const bool refuse = open_streams_.fetch_add(1) >= options_.max_streams;
  if (refuse) open_streams_.fetch_sub(1);
  return new StreamReactor(this, context, response, refuse);
}

grpc::ServerUnaryReactor* LearnerService::GetStatus(grpc::CallbackServerContext* context,
                                                    const v1::GetStatusRequest* /*request*/,
                                                    v1::LearnerStatus* response) {
  const GroupQueueStats q = queue_->Stats();
  const LearnerCounters& k = *counters_;
  response->set_version(version());
  response->set_steps(k.steps.load());
  response->set_queue_depth_groups(static_cast<uint32_t>(q.depth_groups));
  response->set_queue_capacity_groups(static_cast<uint32_t>(q.capacity_groups));
  response->set_accepted_batches(k.accepted_batches.load());
  response->set_rejected_invalid_batches(k.rejected_invalid_batches.load());
  response->set_rejected_full_batches(k.rejected_full_batches.load());
  response->set_accepted_groups(k.accepted_groups.load());
  response->set_trained_groups(k.trained_groups.load());
  response->set_duplicate_batches(k.duplicate_batches.load());
  response->set_skipped_groups(k.skipped_groups.load());
  response->set_batch_id_window(static_cast<uint64_t>(queue_->options().batch_id_window));
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace asympo::learner
