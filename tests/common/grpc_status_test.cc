#include "common/grpc_status.h"
#include "tests/testing/status_matchers.h"

#include <gtest/gtest.h>

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;

TEST(GrpcStatusTest, KeepsCodeAndMessageBothWays) {
  EXPECT_OK(ToGrpcStatus(absl::OkStatus()));
  const grpc::Status g = ToGrpcStatus(absl::ResourceExhaustedError("queue full"));
  EXPECT_THAT(g, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_EQ(g.error_message(), "queue full");
  // Every code maps to the same number in both vocabularies.
  for (int code = 1; code <= 16; ++code) {
    const absl::Status a(static_cast<absl::StatusCode>(code), "m");
    EXPECT_EQ(static_cast<int>(ToGrpcStatus(a).error_code()), code);
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(a)), a);
  }
}

TEST(GrpcStatusTest, NamesTheCallInTheMessage) {
  EXPECT_OK(FromGrpcStatus(grpc::Status::OK, "Register"));
  const absl::Status s =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"), "Register");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(s.message(), "Register: connection refused");
}

TEST(GrpcStatusTest, CodeNamesAreTheCanonicalOnes) {
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::NOT_FOUND), "NOT_FOUND");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNAVAILABLE), "UNAVAILABLE");
}

TEST(GrpcStatusTest, DeadlinesAreFromNowAndInfiniteMeansNone) {
  const auto before = std::chrono::system_clock::now();
  const auto d = GrpcDeadline(absl::Milliseconds(1500));
  const auto after = std::chrono::system_clock::now();
  EXPECT_GE(d, before + std::chrono::milliseconds(1500));
  EXPECT_LE(d, after + std::chrono::milliseconds(1500));
  EXPECT_EQ(GrpcDeadline(absl::InfiniteDuration()), std::chrono::system_clock::time_point::max());
}

}  // namespace
}  // namespace asympo
