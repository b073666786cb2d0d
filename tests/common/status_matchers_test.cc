// The status matchers of tests/testing/status_matchers.h: what they match,
// and that a failure shows the status it got.
#include "tests/testing/status_matchers.h"

#include <memory>

#include <grpcpp/support/status.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace asympo::testing {
namespace {

using ::testing::Not;

TEST(StatusMatchersTest, StatusIsMatchesTheCodeAndASubstringOfTheMessage) {
  absl::Status status = absl::InvalidArgumentError("group 3: reward is NaN");
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, "reward is NaN"));
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kInvalidArgument, "token")));
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kInternal, "reward")));
  EXPECT_THAT(status, Not(IsOk()));
  EXPECT_THAT(absl::OkStatus(), IsOk());
}

TEST(StatusMatchersTest, WorksOnStatusOr) {
  absl::StatusOr<int> value = 7;
  absl::StatusOr<int> error = absl::NotFoundError("no checkpoint");
  EXPECT_OK(value);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kNotFound, "checkpoint"));
  ASSERT_OK_AND_ASSIGN(int v, value);
  EXPECT_EQ(v, 7);
  ASSERT_OK_AND_ASSIGN(auto moved, absl::StatusOr<std::unique_ptr<int>>(std::make_unique<int>(3)));
  EXPECT_EQ(*moved, 3);
}

TEST(StatusMatchersTest, AFailureShowsTheStatus) {
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(absl::UnavailableError("learner at 10.0.0.1:50051 is gone")),
                          "learner at 10.0.0.1:50051 is gone");
  EXPECT_NONFATAL_FAILURE(
      EXPECT_THAT(absl::StatusOr<int>(absl::DataLossError("crc mismatch in bucket 2")),
                  StatusIs(absl::StatusCode::kDataLoss, "bucket 3")),
      "crc mismatch in bucket 2");
}

TEST(StatusMatchersTest, WorksOnGrpcStatusWithEitherCodeEnum) {
  grpc::Status exhausted(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full; retry after 2s");
  EXPECT_THAT(exhausted, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "retry after"));
  EXPECT_THAT(exhausted, StatusIs(absl::StatusCode::kResourceExhausted, "queue full"));
  EXPECT_THAT(exhausted, Not(StatusIs(grpc::StatusCode::UNAVAILABLE)));
  EXPECT_OK(grpc::Status::OK);
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(exhausted), "queue full; retry after 2s");
}

}  // namespace
}  // namespace asympo::testing
