#include "common/submit_retry.h"

#include <algorithm>

#include "common/grpc_status.h"

namespace asympo {

absl::string_view SubmitDecisionName(SubmitDecision d) {
  switch (d) {
    case SubmitDecision::kAccepted:
      return "accepted";
    case SubmitDecision::kRetry:
      return "retry";
    case SubmitDecision::kDropBatch:
      return "drop_batch";
    case SubmitDecision::kFatal:
      return "fatal";
  }
  return "fatal";
}

// The table of docs/protocol.md, "Retries"; tests/common/
// submit_retry_test.cc checks every code against it.
SubmitDecision DecideSubmit(grpc::StatusCode code, bool has_retry_hint) {
  using C = grpc::StatusCode;
  switch (code) {
    case C::OK:
      return SubmitDecision::kAccepted;
    // The outcome is unknown (the learner restarting or away, a deadline, a
    // call cut short, a transport error): the same batch again, same id.
    case C::CANCELLED:
    case C::UNKNOWN:
    case C::DEADLINE_EXCEEDED:
    case C::ABORTED:
    case C::INTERNAL:
    case C::UNAVAILABLE:
      return SubmitDecision::kRetry;
    // With the hint: a full queue, a source's quota, rate or quarantine, the
    // stream or waiting-submission limit. Without it: gRPC refused a message
    // over its size limit, which no retry can pass.
    case C::RESOURCE_EXHAUSTED:
      return has_retry_hint ? SubmitDecision::kRetry : SubmitDecision::kDropBatch;
    // The batch breaks a rule, or the learner's state does not admit it
    // (its objective or limits changed): read its status again, go on.
    case C::INVALID_ARGUMENT:
    case C::FAILED_PRECONDITION:
    case C::OUT_OF_RANGE:
      return SubmitDecision::kDropBatch;
    // Credentials and roles, or an address that serves no learner of this
    // protocol: nothing passes until an operator fixes it.
    case C::UNAUTHENTICATED:
    case C::PERMISSION_DENIED:
    case C::NOT_FOUND:
    case C::ALREADY_EXISTS:
    case C::UNIMPLEMENTED:
    case C::DATA_LOSS:
    default:
      return SubmitDecision::kFatal;
  }
}

SubmitDecision DecideGetStatus(grpc::StatusCode code, bool has_retry_hint) {
  const SubmitDecision d = DecideSubmit(code, has_retry_hint);
  return d == SubmitDecision::kDropBatch ? SubmitDecision::kFatal : d;
}

std::optional<absl::Duration> RetryHintOf(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  if (md.find(kRetryAfterMetadataKey) == md.end()) return std::nullopt;
  return RetryAfterHint(ctx);
}

SubmitBackoff::SubmitBackoff(absl::Duration min, absl::Duration max)
    : min_(min), max_(std::max(min, max)), current_(min), rng_(std::random_device{}()) {}

absl::Duration SubmitBackoff::Next(std::optional<absl::Duration> hint) {
  absl::Duration wait = current_;
  if (hint.has_value()) {
    wait = *hint;
  } else {
    current_ = std::min(current_ * 2, max_);
  }
  return wait * (1.0 + 0.2 * std::uniform_real_distribution<double>(0, 1)(rng_));
}

SubmitAttempt SubmitUntilSettled(v1::Learner::StubInterface& stub, const v1::RolloutBatch& batch,
                                 const SubmitCall& call, SubmitBackoff& backoff,
                                 const std::function<bool(const SubmitAttempt&)>& before_retry,
                                 v1::SubmitResponse* response) {
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(GrpcDeadline(call.timeout));
    if (call.wait_for_ready) ctx.set_wait_for_ready(true);
    SubmitAttempt a;
    a.status = stub.Submit(&ctx, batch, response);
    // Only a RESOURCE_EXHAUSTED refusal carries the learner's hint.
    const std::optional<absl::Duration> hint =
        a.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? RetryHintOf(ctx)
                                                                      : std::nullopt;
    a.decision = DecideSubmit(a.status.error_code(), hint.has_value());
    if (a.decision != SubmitDecision::kRetry) return a;
    a.hinted = hint.has_value();
    a.wait = backoff.Next(hint);
    if (!before_retry(a)) return a;
  }
}

}  // namespace asympo
