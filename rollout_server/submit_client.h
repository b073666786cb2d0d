// The rollout daemon's submit client: a bounded buffer of scored groups and
// a thread that sends them to the learner (Learner.Submit) in batches.
//
// - Connection: it reads GetStatus first (and again after a failed
//   batch, or when the connection drops while it has nothing to send).
//   check_status may refuse the learner's status for good (a configuration
//   the learner can never accept, such as another group size bound); the
//   client then stops and Finish() returns that error.
// - Answers: what each refusal means is decided by the one Submit retry
//   policy (common/submit_retry.h, docs/protocol.md "Retries"). retry: while the
//   learner is away it reconnects with exponential backoff (min_backoff
//   doubling up to max_backoff, with jitter); on RESOURCE_EXHAUSTED it waits
//   the learner's asympo-retry-after-ms hint. drop_batch: the batch is
//   dropped and counted. fatal (credentials, roles, an address that serves
//   no learner), on Submit or GetStatus: the client stops as for a refused
//   status, and Finish() returns the error.
// - Nothing is lost to backpressure or outages: groups stay in the buffer
//   until the learner accepted them, and WaitForRoom holds the producer
//   while the buffer is full.
// - Nothing is trained twice: every batch carries a batch_id
//   ("<source>/<random session id>/<sequence>"), and a batch whose Submit
//   failed is sent again as it was, same id, before anything else. A
//   Submit that the learner accepted but whose reply was lost (a deadline,
//   a dropped connection) is then answered as a duplicate and not queued
//   twice. Groups the learner rejects as invalid, and groups still
//   buffered when the drain after Finish runs out, are dropped and counted
//   by reason (asympo_rollout_groups_dropped_total).
//
// Thread-safe: one producer calls WaitForRoom/Add, any thread may call
// Shutdown.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "common/security/tls.h"
#include "common/submit_retry.h"
#include "rollout_server/rollout_metrics.h"

namespace asympo::rollout {

struct SubmitClientOptions {
  // The learner's gRPC address, and how to reach it securely.
  std::string learner_address;
  security::ClientTlsOptions tls;
  // RolloutBatch.source of every batch.
  std::string source;
  // The most groups held (buffered or being sent).
  int64_t max_buffered_groups = 64;
  // The most groups and serialized bytes per batch; the learner's own
  // max_groups_per_batch caps the first. The learner receives up to 64 MiB.
  int32_t max_groups_per_batch = 16;
  size_t max_batch_bytes = 16 << 20;
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Deadlines of one Submit call and of one GetStatus call.
  absl::Duration submit_timeout = absl::Seconds(60);
  absl::Duration status_timeout = absl::Seconds(5);
  // After Finish, how long buffered groups may still be sent.
  absl::Duration drain_timeout = absl::Seconds(2);
  // Checks each status the learner reports on connecting; an error stops
  // the client (see above). May be empty.
  std::function<absl::Status(const v1::LearnerStatus&)> check_status;
};

class SubmitClient {
 public:
  // Starts the submit thread. INVALID_ARGUMENT for bad options. `metrics`
  // must outlive the client.
  static absl::StatusOr<std::unique_ptr<SubmitClient>> Start(SubmitClientOptions options,
                                                             SubmitMetrics* metrics);
  ~SubmitClient();  // Finish()

  // Blocks until the learner's status is known and `groups` more groups fit
  // in the buffer; returns that status. nullopt once the client stops
  // (Shutdown, Finish, or a refused status).
  std::optional<v1::LearnerStatus> WaitForRoom(int64_t groups);
  // Without waiting: the learner's status when it is known and `groups`
  // more groups fit now; nullopt otherwise (or once the client stops).
  std::optional<v1::LearnerStatus> RoomNow(int64_t groups);
  // Buffers `groups`, in order, for sending.
  void Add(std::vector<v1::PromptGroup> groups);
  // Stops taking new work: WaitForRoom returns nullopt from now on, and
  // the drain clock starts. Any thread; idempotent.
  void Shutdown();
  // No more groups will come: sends what is buffered for up to
  // drain_timeout, drops the rest (counted) and joins the thread. Returns
  // the error that refused the learner's status, if any. Idempotent.
  absl::Status Finish();

  bool stopping() const;
  int64_t accepted_groups() const;

 private:
  enum class Outcome { kSent, kRetry, kStop };

  SubmitClient(SubmitClientOptions options, SubmitMetrics* metrics);
  void Loop();
  // GetStatus and check_status.
  Outcome Connect();
  // The next batch from the front of the buffer (waits briefly for one).
  std::optional<v1::RolloutBatch> TakeBatch();
  // Sends `batch` through the retry policy and settles it.
  void Send(v1::RolloutBatch batch);
  void Accepted(const v1::RolloutBatch& batch, const v1::SubmitResponse& response);
  // Stops taking and sending work for good; Finish() returns `why`.
  void Stop(absl::Status why);
  // Keeps a batch that was not accepted, to be sent again as it is.
  void Retry(v1::RolloutBatch batch);
  // The drain deadline passed, or nothing is left to send after Finish.
  bool Done();
  // Sleeps `d`, or only briefly once stopping (while draining).
  void Pause(absl::Duration d);
  void CountError(grpc::StatusCode code);
  void UpdateBufferGaugeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SubmitClientOptions options_;
  SubmitMetrics* const metrics_;
  // The channel's TLS reloads: the rollout exports no asympo_tls_* metrics
  // (docs/security.md), so they count into a registry nobody scrapes.
  prometheus::Registry tls_registry_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Learner::Stub> stub_;
  std::thread thread_;
  // The submit thread's own.
  bool connected_ = false;
  SubmitBackoff backoff_;
  // The batch to send again (its groups count in in_flight_), and the
  // parts of the next batch id.
  std::optional<v1::RolloutBatch> retry_;
  std::string batch_id_prefix_;
  uint64_t next_batch_ = 0;

  mutable absl::Mutex mu_;
  std::deque<v1::PromptGroup> buffer_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // taken by the thread, not yet settled
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool producer_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::optional<v1::LearnerStatus> status_ ABSL_GUARDED_BY(mu_);
  absl::Status refused_ ABSL_GUARDED_BY(mu_);
  int64_t accepted_groups_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asympo::rollout
