// The Learner gRPC service (proto/asympo/v1/learner.proto) on gRPC's
// callback API: validates every batch, queues it whole in the GroupQueue or
// rejects it whole, and reports status.
//
// The methods are served raw: each request is checked on the wire before it
// is parsed (common/wire/wire_check.h), so that a request that does not parse is
// INVALID_ARGUMENT naming the fault, and the counts a batch may carry are
// bounded before any of it is allocated. Every call is authorized first
// (LearnerServiceOptions::authorizer): Submit and SubmitStream need the
// role submit, GetStatus the role status. A principal's batches are held
// to its quotas: its share of the queue and its rate (RESOURCE_EXHAUSTED
// with the retry hint). A batch's policy versions
// (Response.first_policy_version) are checked against the current version,
// and against the policy-lag bound when one is set (policy_lag.h).
//
// Reactors never block: a submission that finds the queue full waits inside
// the queue (GroupQueue::PushAsync) and its reactor finishes when the queue
// admits it or its deadline passes. On a stream the next message is read
// only after the previous one was queued, so a full queue pauses the sender
// through HTTP/2 flow control. Thread-safe; the service must outlive the
// server that serves it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "common/batch_validation.h"
#include "common/clock.h"
#include "common/keyed_limit.h"
#include "common/listener/call_reaper.h"
#include "common/security/authorizer.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/source_quarantine.h"
#include "learner_server/admission/source_rates.h"

namespace asympo::learner {

class PolicyLag;  // learner_server/admission/policy_lag.h

// Counters shared by the service and the trainer loop, all monotonic. The
// policy version is not among them: the trainer owns it
// (LearnerServiceOptions::version reads it), and moves it inside a step,
// before the step's groups are counted here; `counted_version` follows it
// once they are.
struct LearnerCounters {
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> accepted_batches{0};
  std::atomic<uint64_t> accepted_groups{0};
  std::atomic<uint64_t> accepted_responses{0};
  std::atomic<uint64_t> rejected_invalid_batches{0};
  std::atomic<uint64_t> rejected_full_batches{0};
  // Refused for the source's quota (its share of the queue, or its rate).
  std::atomic<uint64_t> rejected_quota_batches{0};
  std::atomic<uint64_t> trained_groups{0};
  // Batches whose batch_id was accepted before: answered OK, not queued.
  std::atomic<uint64_t> duplicate_batches{0};
  // Groups consumed by steps that were skipped (not trained on).
  std::atomic<uint64_t> skipped_groups{0};
  // The newest checkpoint written or resumed from, and the version below
  // which every batch this process accepted is in it (LearnerStatus).
  std::atomic<uint64_t> checkpoint_version{0};
  std::atomic<uint64_t> recorded_through_version{0};
  // The newest version whose step is counted above: GetStatus reports it, so
  // that a client that reads version v also reads v's trained groups.
  std::atomic<uint64_t> counted_version{0};
};

// Hooks for metrics; every method may be called from many threads.
// result: OutcomeLabel of the batch's AdmissionResult (admission_result.h).
class SubmitObserver {
 public:
  virtual ~SubmitObserver() = default;
  // source: the principal's name ("anonymous" without authentication);
  // result: "accepted", "batch_id_conflict" (a batch_id accepted before
  // with another payload: refused), "duplicate" (a batch_id accepted before: answered
  // OK, not queued), "invalid", "full", "quota" (over the source's share or
  // rate), "policy_lag" (a group more than --max_policy_lag versions
  // behind) or "unavailable"; tokens counts prompt and response tokens.
  virtual void OnBatch(const std::string& source, const std::string& result, int64_t groups,
                       int64_t responses, int64_t tokens) = 0;
};

// A learner process's incarnation: 16 random hex digits.
std::string NewIncarnation();

struct LearnerServiceOptions {
  BatchLimits limits;
  // How long a submission may wait for queue room before
  // RESOURCE_EXHAUSTED (capped by the client's own deadline).
  absl::Duration full_queue_timeout = absl::Seconds(30);
  // Suggested back-off sent with RESOURCE_EXHAUSTED as trailing metadata
  // "asympo-retry-after-ms".
  absl::Duration retry_after = absl::Seconds(1);
  // Reported by GetStatus.
  std::string objective;
  std::string model_signature;
  // SubmitStreams open at once; one more ends at once with
  // RESOURCE_EXHAUSTED. Each open stream holds a reactor and its batch
  // buffer, so idle streams would otherwise pile up without bound.
  int64_t max_streams = 1024;
  // Of them, the most one principal (one peer address without
  // authentication) may hold; 0: a quarter, at least 1.
  int64_t max_streams_per_principal = 0;
  // A SubmitStream that sends no batch for this long is cancelled.
  absl::Duration stream_idle_timeout = absl::Minutes(10);
  // The largest request, in bytes (gRPC's receive limit is the same).
  int64_t max_message_bytes = int64_t{64} << 20;
  // Who may call, and each principal's quotas. Null: everyone, as
  // "anonymous", without quotas.
  security::Authorizer* authorizer = nullptr;
  // Test-only fault: how long Submit holds its reply after the batch was
  // queued, so that a client's deadline can pass after the learner
  // accepted (the retry of an accepted batch, made reproducible).
  absl::Duration fault_reply_delay = absl::ZeroDuration();
  // The current policy version (the trainer's), for GetStatus, Submit's
  // reply and each queued group's arrival version. Called from gRPC
  // threads. Empty: always 0.
  std::function<uint64_t()> version;
  // When set, the bytes of every request (CountReceived), before any check.
  std::atomic<int64_t>* received_bytes = nullptr;
  // When set, a quarantined source's batches are refused before they are
  // parsed (RESOURCE_EXHAUSTED, the hint the time left).
  SourceQuarantine* quarantine = nullptr;
  // When set, the policy-lag bound batches are held to (a group more than
  // its max_lag() versions behind the current version is refused with
  // FAILED_PRECONDITION), where those refusals are counted, and what
  // GetStatus reports of the policy lag. Whether set or not, a policy
  // version above the current version is INVALID_ARGUMENT.
  PolicyLag* policy_lag = nullptr;
  // This learner process's incarnation (a random id per start; empty: the
  // service makes one) and the checkpoint version it resumed from, for
  // GetStatus and every Submit reply.
  std::string incarnation;
  uint64_t resumed_from_version = 0;
  // The time that source rates and the quarantine are measured in (tests
  // pass a fake one to expire a window without waiting). Outlives the
  // service.
  const Clock* clock = RealClock();
};

using LearnerServiceBase =
    v1::Learner::WithRawCallbackMethod_Submit<v1::Learner::WithRawCallbackMethod_SubmitStream<
        v1::Learner::WithRawCallbackMethod_GetStatus<v1::Learner::Service>>>;

class LearnerService final : public LearnerServiceBase {
 public:
  // `queue` and `counters` must outlive the service; `observer` may be null.
  LearnerService(LearnerServiceOptions options, GroupQueue* queue, LearnerCounters* counters,
                 SubmitObserver* observer = nullptr);

  // Requests are serialized RolloutBatch / GetStatusRequest messages;
  // replies serialized SubmitResponse / LearnerStatus messages.
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* SubmitStream(grpc::CallbackServerContext* context,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

  // Checks and parses one serialized batch, validates it and converts it to
  // queue entries of `source`: kAccepted, or kInvalid as in
  // CheckRolloutBatchWire and ValidateRolloutBatch. `counts` gets the
  // batch's sizes.
  AdmissionResult Prepare(const grpc::ByteBuffer& raw, const std::string& source,
                          std::vector<QueuedGroup>* groups, BatchCounts* counts) const;
  // Validates `batch` and converts it to queue entries (moving its groups
  // out): kAccepted, or kInvalid as in ValidateRolloutBatch; its policy
  // versions as in CheckPolicyVersions (learner_server/admission/policy_lag.h).
  AdmissionResult Prepare(v1::RolloutBatch* batch, std::vector<QueuedGroup>* groups) const;
  // The caller, if it may act in `role` (an open service: "anonymous").
  absl::StatusOr<const security::Principal*> Authorize(const grpc::CallbackServerContext& ctx,
                                                       security::Role role) const;
  // kAccepted unless the principal is quarantined
  // (LearnerServiceOptions::quarantine): kQuota (kQuarantined) with the
  // time left as its retry hint.
  AdmissionResult AdmitSource(const security::Principal& p) const;
  // Takes `groups` from the principal's rate: kAccepted, or kQuota (kRate)
  // with the wait as its retry hint when it is over it.
  AdmissionResult AdmitRate(const security::Principal& p, int64_t groups) const;
  // Gives back what AdmitRate took for groups the queue did not keep.
  void RefundRate(const security::Principal& p, int64_t groups) const {
    rates_.Refund(p.name, p.groups_per_second, groups);
  }
  // The most groups the principal may hold in the queue (0: no limit).
  int64_t SourceLimit(const security::Principal& p) const;
  // Counts a quota refusal (a no-op without an authorizer).
  void CountRefusal(const std::string& code, const std::string& cause) const;
  CallReaper& reaper() const { return reaper_; }
  // What GetStatus answers.
  v1::LearnerStatus Status() const;

  const LearnerServiceOptions& options() const { return options_; }
  GroupQueue* queue() const { return queue_; }
  LearnerCounters* counters() const { return counters_; }
  SubmitObserver* observer() const { return observer_; }
  uint64_t version() const { return options_.version ? options_.version() : 0; }
  // SubmitStreams open now.
  int64_t open_streams() const;
  // Takes a stream's place for the share key `key` (security::ShareKey):
  // RESOURCE_EXHAUSTED naming the limit when `key` holds
  // max_streams_per_principal or all hold max_streams.
  absl::Status OpenStream(const std::string& key) const;
  void StreamClosed(const std::string& key) const;

 private:
  LearnerServiceOptions options_;
  GroupQueue* queue_;
  LearnerCounters* counters_;
  SubmitObserver* observer_;
  mutable absl::Mutex streams_mu_;
  mutable KeyedLimit streams_ ABSL_GUARDED_BY(streams_mu_);
  mutable SourceRates rates_;
  mutable CallReaper reaper_;
};

}  // namespace asympo::learner
