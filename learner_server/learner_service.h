// The Learner gRPC service (proto/asympo/v1/learner.proto) on gRPC's
// callback API: validates every batch, queues it whole in the GroupQueue or
// rejects it whole, and reports status.
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

#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "common/batch_validation.h"
#include "learner_server/group_queue.h"

namespace asympo::learner {

// Counters shared by the service and the trainer loop, all monotonic. The
// policy version is not among them: the trainer owns it
// (LearnerServiceOptions::version reads it).
struct LearnerCounters {
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> accepted_batches{0};
  std::atomic<uint64_t> accepted_groups{0};
  std::atomic<uint64_t> accepted_responses{0};
  std::atomic<uint64_t> rejected_invalid_batches{0};
  std::atomic<uint64_t> rejected_full_batches{0};
  std::atomic<uint64_t> trained_groups{0};
  // Batches whose batch_id was accepted before: answered OK, not queued.
  std::atomic<uint64_t> duplicate_batches{0};
  // Groups consumed by steps that were skipped (not trained on).
  std::atomic<uint64_t> skipped_groups{0};
};

// Hooks for metrics; every method may be called from many threads.
class SubmitObserver {
 public:
  virtual ~SubmitObserver() = default;
  // result: "accepted", "duplicate" (a batch_id accepted before: answered
  // OK, not queued), "invalid", "full" or "unavailable"; tokens counts
  // prompt and response tokens.
  virtual void OnBatch(const std::string& result, int64_t groups, int64_t responses,
                       int64_t tokens) = 0;
};

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
  // Test-only fault: how long Submit holds its reply after the batch was
  // queued, so that a client's deadline can pass after the learner
  // accepted (the retry of an accepted batch, made reproducible).
  absl::Duration fault_reply_delay = absl::ZeroDuration();
  // The current policy version (the trainer's), for GetStatus, Submit's
  // reply and each queued group's arrival version. Called from gRPC
  // threads. Empty: always 0.
  std::function<uint64_t()> version;
};

class LearnerService final : public v1::Learner::CallbackService {
 public:
  // `queue` and `counters` must outlive the service; `observer` may be null.
  LearnerService(LearnerServiceOptions options, GroupQueue* queue, LearnerCounters* counters,
                 SubmitObserver* observer = nullptr);

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const v1::RolloutBatch* request,
                                   v1::SubmitResponse* response) override;
  grpc::ServerReadReactor<v1::RolloutBatch>* SubmitStream(grpc::CallbackServerContext* context,
                                                          v1::SubmitResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::LearnerStatus* response) override;

  // Validates `batch` and converts it to queue entries (moving its groups
  // out). INVALID_ARGUMENT as in ValidateRolloutBatch.
  absl::Status Prepare(v1::RolloutBatch* batch, std::vector<QueuedGroup>* groups) const;

  const LearnerServiceOptions& options() const { return options_; }
  GroupQueue* queue() const { return queue_; }
  LearnerCounters* counters() const { return counters_; }
  SubmitObserver* observer() const { return observer_; }
  uint64_t version() const { return options_.version ? options_.version() : 0; }
  // SubmitStreams open now.
  int64_t open_streams() const { return open_streams_.load(); }
  void StreamClosed() const { open_streams_.fetch_sub(1); }

 private:
  LearnerServiceOptions options_;
  GroupQueue* queue_;
  LearnerCounters* counters_;
  SubmitObserver* observer_;
  mutable std::atomic<int64_t> open_streams_{0};
};

}  // namespace asympo::learner
