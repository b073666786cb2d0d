// The NCCL broadcaster against the real libnccl and libcudart, one rank on
// one GPU (ctest label "gpu"; deploy/gpu_check.sh runs them on a GPU node).
// Each test skips itself, with the reason, where no GPU or NCCL is found,
// except the one that checks a clean failure on a machine without them.
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/status_matchers.h"
#include "weight_broadcaster/nccl/nccl_loader.h"
#include "weight_broadcaster/nccl/nccl_transport.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(NcclTransportWithoutGpuTest, CreateFailsCleanlyWhereNoGpuOrNcclIsPresent) {
  if (GpuAvailable()) GTEST_SKIP() << "this machine has a GPU; NcclTransportGpuTest covers it";
  absl::StatusOr<std::unique_ptr<NcclBroadcaster>> b =
      NcclBroadcaster::Create(std::string(128, '\0'), 0, 1, 0);
  EXPECT_THAT(b, ::testing::AnyOf(StatusIs(absl::StatusCode::kUnavailable),
                                  StatusIs(absl::StatusCode::kNotFound),
                                  StatusIs(absl::StatusCode::kFailedPrecondition)));
  EXPECT_THAT(std::string(b.status().message()),
              ::testing::AnyOf(HasSubstr("NCCL"), HasSubstr("CUDA")));
}

// Skips with the reason unless the real NCCL and a CUDA device are here.
#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    absl::StatusOr<const NcclApi*> api = LoadNccl();                                        \
    if (!api.ok()) GTEST_SKIP() << "NCCL or the CUDA runtime is missing: " << api.status(); \
    absl::StatusOr<int> devices = CudaDeviceCount(**api);                                   \
    if (!devices.ok() || *devices == 0) {                                                   \
      GTEST_SKIP() << (devices.ok() ? "no CUDA device: cudaGetDeviceCount returned 0"       \
                                    : std::string(devices.status().message()));             \
    }                                                                                       \
  } while (0)

TEST(NcclTransportGpuTest, OneRankBroadcastsAndReadsBackSeveralMiB) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_OK(id);
  NcclBroadcasterOptions options;
  options.staging_bytes = 2 << 20;  // 1 MiB pieces: a 5 MiB bucket takes 6
  options.timeout = absl::Seconds(30);
  auto b = NcclBroadcaster::Create(*id, 0, 1, 0, options);
  ASSERT_OK(b);
  EXPECT_EQ((*b)->piece_bytes(), 1u << 20);
  std::string src((5 << 20) + 123, '\0');
  std::mt19937 rng(6);
  for (char& c : src) c = static_cast<char>(rng());
  std::string copy = src;
  ASSERT_OK((*b)->Broadcast(copy.data(), copy.size()));
  EXPECT_TRUE(copy == src);
  std::string readback(src.size(), '\0');
  const absl::Time start = absl::Now();
  ASSERT_OK((*b)->BroadcastWithReadback(src.data(), readback.data(), src.size()));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(readback == src);
  RecordProperty("readback_seconds", absl::StrCat(absl::ToDoubleSeconds(took)));
  EXPECT_TRUE((*b)->healthy());
}

TEST(NcclTransportGpuTest, OneRankBroadcastsStraightFromDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const NcclApi& api = *LoadNccl().value();
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_OK(id);
  NcclBroadcasterOptions options;
  options.staging_bytes = 2 << 20;
  options.timeout = absl::Seconds(30);
  auto b = NcclBroadcaster::Create(*id, 0, 1, 0, options);
  ASSERT_OK(b);
  std::string src((3 << 20) + 77, '\0');
  std::mt19937 rng(7);
  for (char& c : src) c = static_cast<char>(rng());
  void* device = nullptr;
  ASSERT_EQ(api.cudaMalloc(&device, src.size()), nccl::kCudaSuccess);
  ASSERT_EQ(api.cudaMemcpy(device, src.data(), src.size(), nccl::kMemcpyHostToDevice),
            nccl::kCudaSuccess);
  EXPECT_OK((*b)->BroadcastFromDevice(device, src.size()));
  std::string back(src.size(), '\0');
  ASSERT_EQ(api.cudaMemcpy(back.data(), device, back.size(), nccl::kMemcpyDeviceToHost),
            nccl::kCudaSuccess);
  EXPECT_TRUE(back == src) << "an in-place broadcast must leave the root's bytes as they were";
  api.cudaFree(device);
  EXPECT_TRUE((*b)->healthy());
}

TEST(NcclTransportGpuTest, InitWatchdogFiresWhenThePeerNeverJoins) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_OK(id);
  NcclBroadcasterOptions options;
  options.init_timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto b = NcclBroadcaster::Create(*id, 0, 2, 0, options);  // rank 1 never comes
  ASSERT_THAT(b, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(b.status().message(),
              AllOf(HasSubstr("communicator init"), HasSubstr("rank 0 of 2")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

}  // namespace
}  // namespace asympo::broadcast
