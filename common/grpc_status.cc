#include "common/grpc_status.h"

#include <algorithm>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace asympo {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (what.empty()) return absl::Status(code, status.error_message());
  return absl::Status(code, absl::StrCat(what, ": ", status.error_message()));
}

std::string GrpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

std::chrono::system_clock::time_point GrpcDeadline(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return std::chrono::system_clock::time_point::max();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             absl::ToChronoNanoseconds(timeout));
}

absl::Duration RetryAfterHint(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find(kRetryAfterMetadataKey);
  int64_t ms = 0;
  if (it == md.end() || !absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &ms) ||
      ms < 0) {
    return absl::Seconds(1);
  }
  return std::min(absl::Milliseconds(ms), absl::Seconds(60));
}

std::string QuoteForMessage(absl::string_view s, size_t max_bytes) {
  const bool cut = s.size() > max_bytes;
  return absl::StrCat("\"", absl::CHexEscape(cut ? s.substr(0, max_bytes) : s), cut ? "..." : "",
                      "\"");
}

}  // namespace asympo
