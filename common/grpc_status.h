// Conversions between absl::Status and grpc::Status, and gRPC deadlines from
// absl durations: the one place where the two status vocabularies meet.
// Both use the same numeric codes (0..16), so a code maps to itself.
// Thread-safe (pure functions).
#pragma once

#include <chrono>

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace asympo {

// absl::Status -> grpc::Status, keeping code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// grpc::Status -> absl::Status with the same code; a non-empty `what` (the
// call, e.g. "Register") prefixes the message: "Register: <message>".
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what = "");

// The gRPC status code's name, e.g. "RESOURCE_EXHAUSTED" (a metric label).
std::string GrpcCodeName(grpc::StatusCode code);

// A gRPC deadline `timeout` from now, for ClientContext::set_deadline. An
// infinite duration gives time_point::max() (no deadline).
std::chrono::system_clock::time_point GrpcDeadline(absl::Duration timeout);

// Trailing metadata of a RESOURCE_EXHAUSTED refusal: how long the learner
// suggests waiting before the retry, in milliseconds.
inline constexpr char kRetryAfterMetadataKey[] = "asympo-retry-after-ms";

// The learner's retry hint from the trailing metadata of a finished call:
// 1 s when it is absent, unreadable or negative, at most 60 s.
absl::Duration RetryAfterHint(const grpc::ClientContext& ctx);

// A client's string as an error message may echo it: cut to `max_bytes`
// (then "..."), C-escaped and in double quotes. An echoed megabyte would
// push the real message past gRPC's metadata limit.
std::string QuoteForMessage(absl::string_view s, size_t max_bytes = 64);

}  // namespace asympo
