#include "common/model/device.h"
#include "tests/testing/status_matchers.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParseDeviceTest, AcceptsCpu) {
  absl::StatusOr<c10::Device> d = ParseDevice("cpu");
  ASSERT_OK(d);
  EXPECT_TRUE(d->is_cpu());
}

TEST(ParseDeviceTest, RejectsMalformedValuesNamingThem) {
  for (const char* bad :
       {"gpu", "", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cuda0", "cuda:99999999999"}) {
    absl::StatusOr<c10::Device> d = ParseDevice(bad);
    ASSERT_THAT(
        d, StatusIs(absl::StatusCode::kInvalidArgument, std::string("--device: \"") + bad + "\""))
        << bad;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("cpu, cuda or cuda:N"));
  }
}

TEST(ParseDeviceTest, CudaNeedsAVisibleGpu) {
  const int gpus = CudaDeviceCount();
  absl::StatusOr<c10::Device> first = ParseDevice("cuda");
  absl::StatusOr<c10::Device> beyond = ParseDevice("cuda:" + std::to_string(gpus));
  ASSERT_THAT(beyond, StatusIs(absl::StatusCode::kFailedPrecondition));
  if (gpus == 0) {
    ASSERT_THAT(first, StatusIs(absl::StatusCode::kFailedPrecondition, "\"cuda\""));
  } else {
    ASSERT_OK(first);
    EXPECT_TRUE(first->is_cuda());
    EXPECT_THAT(std::string(beyond.status().message()),
                HasSubstr(std::to_string(gpus) + " CUDA device(s) are visible"));
  }
}

TEST(ParseComputeDTypeTest, AutoIsBfloat16OnAGpuAndFloat32OnTheCpu) {
  EXPECT_EQ(ParseComputeDType("auto", c10::Device(c10::kCPU)).value(), c10::kFloat);
  EXPECT_EQ(ParseComputeDType("auto", c10::Device(c10::kCUDA, 0)).value(), c10::kBFloat16);
  EXPECT_EQ(ParseComputeDType("bfloat16", c10::Device(c10::kCPU)).value(), c10::kBFloat16);
  EXPECT_EQ(ParseComputeDType("float32", c10::Device(c10::kCUDA, 0)).value(), c10::kFloat);
  absl::StatusOr<c10::ScalarType> bad = ParseComputeDType("fp16", c10::Device(c10::kCPU));
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, "--compute_dtype: \"fp16\""));
}

TEST(SetCpuThreadsTest, CapsLibTorchAndOpenBlas) {
  using GetThreads = int (*)();
  const auto openblas =
      reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  for (const int threads : {2, 1}) {
    const int blas = SetCpuThreads(threads);
    EXPECT_EQ(at::get_num_threads(), threads);
    if (openblas == nullptr) {
      EXPECT_EQ(blas, 0);  // another BLAS: nothing more to cap
    } else {
      EXPECT_EQ(blas, threads);
      EXPECT_EQ(openblas(), threads);
    }
  }
}

}  // namespace
}  // namespace asympo
