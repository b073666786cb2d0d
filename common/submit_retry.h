// The one Submit retry policy of the protocol's clients: the rollout
// daemon's sender (rollout_server/submit_client.h) and asympo-submit
// (rollout_server/submit/submit_main.cc) decide what to do with a learner's answer
// here, and send through the one loop below. The Python client (proto/python/asympo_rl/client.py)
// implements the same table with the same decision names. The table, and why each code is where it
// is: docs/protocol.md, "Retries".
//
//   retry       send the same batch, with the same batch_id, again: after
//               the learner's asympo-retry-after-ms hint when the answer
//               carries one, else after the exponential backoff
//   drop_batch  final for this batch: no retry can pass it; the batch is
//               dropped and counted, the learner's status read again, and
//               the generator goes on with its next batch
//   fatal       a configuration error (credentials, roles, an address that
//               serves no learner): nothing will pass until an operator
//               fixes it; the tool stops
//
// Thread-safe: the functions are pure; a SubmitBackoff belongs to one
// sender.
#pragma once

#include <functional>
#include <optional>
#include <random>

#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"

namespace asympo {

enum class SubmitDecision { kAccepted, kRetry, kDropBatch, kFatal };

// "accepted", "retry", "drop_batch" or "fatal": the Python client's names.
absl::string_view SubmitDecisionName(SubmitDecision d);

// The decision for a finished Submit (or SubmitStream) with status `code`;
// `has_retry_hint`: its trailing metadata carried asympo-retry-after-ms.
SubmitDecision DecideSubmit(grpc::StatusCode code, bool has_retry_hint);

// The same for GetStatus, which has no batch to drop: what would drop a
// batch is fatal there (the learner cannot answer this client as it is).
SubmitDecision DecideGetStatus(grpc::StatusCode code, bool has_retry_hint);

// The learner's hint in a finished call's trailing metadata, if any (see
// RetryAfterHint in common/grpc_status.h for its reading and bounds).
std::optional<absl::Duration> RetryHintOf(const grpc::ClientContext& ctx);

// The wait before a retry: the learner's hint when there is one, else an
// exponential backoff (min doubling up to max, reset by Reset()), both plus
// up to 20% jitter so that many generators refused together do not come
// back together.
class SubmitBackoff {
 public:
  SubmitBackoff(absl::Duration min, absl::Duration max);
  // The wait before the next attempt; a hint leaves the backoff as it is.
  absl::Duration Next(std::optional<absl::Duration> hint);
  // The next backoff without a hint, before jitter.
  absl::Duration current() const { return current_; }
  void Reset() { current_ = min_; }

 private:
  const absl::Duration min_, max_;
  absl::Duration current_;
  std::mt19937_64 rng_;
};

// One answered attempt of the loop below.
struct SubmitAttempt {
  grpc::Status status;
  SubmitDecision decision = SubmitDecision::kRetry;
  bool hinted = false;                         // the wait is the learner's hint
  absl::Duration wait = absl::ZeroDuration();  // before the next attempt (kRetry)
};

struct SubmitCall {
  absl::Duration timeout = absl::Seconds(60);  // of one attempt
  bool wait_for_ready = false;  // wait for the channel to connect, within the timeout
};

// The Submit loop: sends `batch` (its bytes and batch_id unchanged) until
// the decision is not kRetry, or `before_retry` declines another attempt.
// `before_retry` sees every kRetry attempt, with its wait chosen; it counts,
// logs and waits, and returns whether to send again. Returns the last
// attempt (kRetry when `before_retry` declined), with the reply in
// `*response` when accepted.
SubmitAttempt SubmitUntilSettled(v1::Learner::StubInterface& stub, const v1::RolloutBatch& batch,
                                 const SubmitCall& call, SubmitBackoff& backoff,
                                 const std::function<bool(const SubmitAttempt&)>& before_retry,
                                 v1::SubmitResponse* response);

}  // namespace asympo
