#include "common/model/torch_errors.h"

#include <new>
#include <stdexcept>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "common/model/policy_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_policy.h"

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(TorchErrorsTest, AShapeErrorBecomesInternalWithoutTheBacktrace) {
  const absl::StatusOr<at::Tensor> r =
      GuardTorch("multiplying", []() -> absl::StatusOr<at::Tensor> {
        return torch::ones({2, 3}).matmul(torch::ones({4, 5}));
      });
  ASSERT_THAT(r, StatusIs(absl::StatusCode::kInternal, "multiplying: "));
  EXPECT_THAT(std::string(r.status().message()), Not(HasSubstr("\n")));
}

TEST(TorchErrorsTest, IndexAndValueErrorsAreInvalidArguments) {
  const absl::Status s = GuardTorch("indexing", []() -> absl::Status {
    torch::ones({2}).select(0, 7);
    return absl::OkStatus();
  });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TorchErrorsTest, OutOfMemoryIsResourceExhausted) {
  const absl::Status bad_alloc =
      GuardTorch("allocating", []() -> absl::Status { throw std::bad_alloc(); });
  EXPECT_THAT(bad_alloc,
              StatusIs(absl::StatusCode::kResourceExhausted, "allocating: out of memory"));
  const absl::Status c10_oom = StatusFromException(
      c10::OutOfMemoryError({"f", "file.cc", 1}, "CUDA out of memory. Tried to allocate 2 GiB"),
      "training step");
  EXPECT_THAT(c10_oom, StatusIs(absl::StatusCode::kResourceExhausted, "Tried to allocate 2 GiB"));
}

TEST(TorchErrorsTest, OtherExceptionsAndOkResultsPassThrough) {
  EXPECT_EQ(GuardTorch("x", []() -> absl::Status { throw std::runtime_error("boom"); }).message(),
            "x: boom");
  EXPECT_THAT(GuardTorch("x", []() -> absl::Status { throw 42; }),
              StatusIs(absl::StatusCode::kInternal));
  const absl::StatusOr<int> ok = GuardTorch("x", []() -> absl::StatusOr<int> { return 3; });
  ASSERT_OK(ok);
  EXPECT_EQ(*ok, 3);
}

TEST(TorchErrorsTest, LoadParametersThatFailsHalfwayChangesNothing) {
  auto model = ::asympo::testing::TinyPolicy(64);
  std::vector<std::pair<std::string, at::Tensor>> before, source;
  for (const auto& [name, t] : model->named_parameters()) {
    before.emplace_back(name, t.clone());
    source.emplace_back(name, torch::full_like(t, 0.5));
  }
  // Right names and shapes, but the last tensor cannot be brought to the
  // model's device (a meta tensor has no data): nothing may be copied.
  source.back().second =
      torch::zeros(source.back().second.sizes(), torch::TensorOptions().device(torch::kMeta));
  const absl::Status s = model->LoadParameters(source);
  ASSERT_THAT(s, StatusIs(absl::StatusCode::kInternal, "loading parameters"));
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(model->named_parameters()[i].second, before[i].second))
        << before[i].first << " changed";
  }
}

}  // namespace
}  // namespace asympo
