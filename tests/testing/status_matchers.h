// gMock matchers for absl::Status and absl::StatusOr<T> that show the status
// when they fail:
//
//   EXPECT_THAT(queue.Push(batch), StatusIs(absl::StatusCode::kResourceExhausted, "full"));
//   ASSERT_OK(trainer->Step(groups));
//   ASSERT_OK_AND_ASSIGN(auto result, trainer->Step(groups));
//
// StatusIs(code, substring) matches a status of that code whose message
// contains `substring` (any message when it is empty). They also match a
// grpc::Status (anything with error_code() and error_message()), and the code
// may be given as a grpc::StatusCode: the two enums number the canonical codes
// alike, and anything else with a status() member.
#pragma once

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace asympo::testing {
namespace internal_status {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
// Anything else with a status() (an AdmissionResult, say).
template <typename T>
auto GetStatus(const T& value) -> decltype(static_cast<const absl::Status&>(value.status())) {
  return value.status();
}
// A grpc::Status, without including gRPC here.
template <typename GrpcStatus>
auto GetStatus(const GrpcStatus& status)
    -> decltype(status.error_code(), status.error_message(), absl::Status()) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

template <typename StatusType>
class StatusIsMatcher : public ::testing::MatcherInterface<const StatusType&> {
 public:
  StatusIsMatcher(absl::StatusCode code, std::string substring)
      : code_(code), substring_(std::move(substring)) {}

  bool MatchAndExplain(const StatusType& value,
                       ::testing::MatchResultListener* listener) const override {
    const absl::Status& status = GetStatus(value);  // may be a temporary (gRPC)
    *listener << "whose status is " << status;
    return status.code() == code_ && absl::StrContains(status.message(), substring_);
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "has status code " << absl::StatusCodeToString(code_);
    if (!substring_.empty()) *os << " and a message containing \"" << substring_ << "\"";
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "does not have status code " << absl::StatusCodeToString(code_);
    if (!substring_.empty()) *os << " with a message containing \"" << substring_ << "\"";
  }

 private:
  absl::StatusCode code_;
  std::string substring_;
};

// Polymorphic: converts to a matcher of Status or of any StatusOr<T>.
class StatusIsPolymorphic {
 public:
  StatusIsPolymorphic(absl::StatusCode code, std::string substring)
      : code_(code), substring_(std::move(substring)) {}
  template <typename StatusType>
  operator ::testing::Matcher<const StatusType&>() const {  // NOLINT: implicit by design
    return ::testing::Matcher<const StatusType&>(
        new StatusIsMatcher<StatusType>(code_, substring_));
  }

 private:
  absl::StatusCode code_;
  std::string substring_;
};

}  // namespace internal_status

// A Status or StatusOr whose code is `code` and whose message contains
// `substring`.
inline internal_status::StatusIsPolymorphic StatusIs(absl::StatusCode code,
                                                     absl::string_view substring = "") {
  return internal_status::StatusIsPolymorphic(code, std::string(substring));
}
// The same with another enum of the canonical codes (grpc::StatusCode).
template <typename Code, typename = std::enable_if_t<std::is_enum_v<Code> &&
                                                     !std::is_same_v<Code, absl::StatusCode>>>
internal_status::StatusIsPolymorphic StatusIs(Code code, absl::string_view substring = "") {
  return StatusIs(static_cast<absl::StatusCode>(code), substring);
}

// An OK Status, or a StatusOr holding a value.
inline internal_status::StatusIsPolymorphic IsOk() {
  return internal_status::StatusIsPolymorphic(absl::StatusCode::kOk, "");
}

}  // namespace asympo::testing

#define ASYMPO_STATUS_CONCAT_INNER(a, b) a##b
#define ASYMPO_STATUS_CONCAT(a, b) ASYMPO_STATUS_CONCAT_INNER(a, b)

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::asympo::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::asympo::testing::IsOk())

// ASSERT_OK_AND_ASSIGN(auto x, StatusOrExpr): fails the test (showing the
// status) unless the expression holds a value, then moves it into `x`.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASYMPO_ASSERT_OK_AND_ASSIGN_IMPL(ASYMPO_STATUS_CONCAT(status_or_, __LINE__), lhs, expr)
#define ASYMPO_ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  ASSERT_OK(tmp);                                        \
  lhs = std::move(tmp).value()
