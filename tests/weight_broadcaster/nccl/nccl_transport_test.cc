// The NCCL transport, in three layers:
// - the loader against missing, misnamed and wrong libraries (any machine);
// - the broadcaster against fake_nccl.cc, a CPU stand-in for libnccl and
//   libcudart: pipeline, handshake, multi-rank delivery and the watchdog
//   (any machine);
// - the real libraries: nccl_gpu_test.cc (ctest label "gpu").
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/status_matchers.h"
#include "tests/weight_broadcaster/nccl/fake_nccl.h"
#include "weight_broadcaster/nccl/nccl_loader.h"
#include "weight_broadcaster/nccl/nccl_transport.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The fake's controls, looked up in the same library the loader opens.
struct FakeControls {
  void (*reset)() = nullptr;
  void (*configure)(const AsympoFakeNcclConfig*) = nullptr;
  void (*stats)(AsympoFakeNcclStats*) = nullptr;
  void (*release_blocked_inits)() = nullptr;

  static const FakeControls& Get() {
    static const FakeControls controls = [] {
      FakeControls c;
      void* handle = dlopen(ASYMPO_FAKE_NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        ADD_FAILURE() << "cannot open " << ASYMPO_FAKE_NCCL_LIBRARY << ": " << dlerror();
        std::abort();
      }
      c.reset = reinterpret_cast<void (*)()>(dlsym(handle, "asympo_fake_nccl_reset"));
      c.configure = reinterpret_cast<void (*)(const AsympoFakeNcclConfig*)>(
          dlsym(handle, "asympo_fake_nccl_configure"));
      c.stats =
          reinterpret_cast<void (*)(AsympoFakeNcclStats*)>(dlsym(handle, "asympo_fake_nccl_stats"));
      c.release_blocked_inits =
          reinterpret_cast<void (*)()>(dlsym(handle, "asympo_fake_nccl_release_blocked_inits"));
      if (!c.reset || !c.configure || !c.stats || !c.release_blocked_inits) std::abort();
      return c;
    }();
    return controls;
  }
};

AsympoFakeNcclStats FakeStats() {
  AsympoFakeNcclStats stats;
  FakeControls::Get().stats(&stats);
  return stats;
}

NcclLoadOptions FakeLibraries() {
  NcclLoadOptions load;
  load.nccl_library = ASYMPO_FAKE_NCCL_LIBRARY;
  load.cudart_library = ASYMPO_FAKE_NCCL_LIBRARY;
  return load;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

// ---- Loader ----

TEST(NcclLoaderTest, DefaultLoadSucceedsOrNamesTheMissingLibrary) {
  ScopedEnv nccl("ASYMPO_NCCL_LIBRARY", nullptr);
  ScopedEnv cudart("ASYMPO_CUDART_LIBRARY", nullptr);
  absl::StatusOr<const NcclApi*> api = LoadNccl();
  if (api.ok()) {
    EXPECT_GE((*api)->nccl_version, nccl::VersionCode(2, 4, 0));
    EXPECT_NE((*api)->ncclBroadcast, nullptr);
    EXPECT_NE((*api)->cudaMemcpyAsync, nullptr);
    return;
  }
  EXPECT_THAT(api, StatusIs(absl::StatusCode::kUnavailable, "library not found"));
  EXPECT_THAT(api, StatusIs(absl::StatusCode::kUnavailable, "gRPC transport"));
}

TEST(NcclLoaderTest, ReportsALibraryNamedInOptionsThatCannotBeOpened) {
  NcclLoadOptions load = FakeLibraries();
  load.nccl_library = "/nonexistent/libnccl.so.2";
  absl::StatusOr<const NcclApi*> api = LoadNccl(load);
  ASSERT_THAT(api, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(api.status().message(),
              AllOf(HasSubstr("NCCL library"), HasSubstr("/nonexistent/libnccl.so.2")));
}

TEST(NcclLoaderTest, ReportsALibraryNamedInTheEnvironmentThatCannotBeOpened) {
  ScopedEnv cudart("ASYMPO_CUDART_LIBRARY", "/nonexistent/libcudart.so");
  absl::StatusOr<const NcclApi*> api = LoadNccl();
  ASSERT_THAT(api, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(api.status().message(),
              AllOf(HasSubstr("CUDA runtime"), HasSubstr("/nonexistent/libcudart.so"),
                    HasSubstr("ASYMPO_CUDART_LIBRARY")));
}

TEST(NcclLoaderTest, RejectsALibraryWithoutNcclSymbols) {
  NcclLoadOptions load = FakeLibraries();
  load.nccl_library = "libm.so.6";
  absl::StatusOr<const NcclApi*> api = LoadNccl(load);
  ASSERT_THAT(api, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(api.status().message(), AllOf(HasSubstr("libm.so.6"), HasSubstr("ncclGetVersion")));
}

TEST(NcclLoaderTest, LoadsTheFakeAndDecodesVersions) {
  FakeControls::Get().reset();
  absl::StatusOr<const NcclApi*> api = LoadNccl(FakeLibraries());
  ASSERT_OK(api);
  EXPECT_EQ((*api)->nccl_version, 22809);
  EXPECT_TRUE((*api)->SupportsNonBlockingInit());
  EXPECT_EQ(*LoadNccl(FakeLibraries()), *api);  // cached
  EXPECT_EQ(NcclVersionString(22809), "2.28.9");
  EXPECT_EQ(NcclVersionString(2804), "2.8.4");
  EXPECT_EQ(nccl::VersionCode(2, 8, 4), 2804);
  EXPECT_EQ(nccl::VersionCode(2, 14, 3), 21403);
  EXPECT_THAT((*api)->NcclErrorText(nccl::kRemoteError), HasSubstr("ncclRemoteError (6)"));
  EXPECT_TRUE(GpuAvailable(FakeLibraries()));
}

// ---- Broadcaster against the fake ----

class NcclTransportFakeTest : public ::testing::Test {
 protected:
  void SetUp() override { FakeControls::Get().reset(); }
  void Configure(const AsympoFakeNcclConfig& config) { FakeControls::Get().configure(&config); }

  static NcclBroadcasterOptions Options(uint64_t staging_bytes = 16 << 10) {
    NcclBroadcasterOptions options;
    options.load = FakeLibraries();
    options.staging_bytes = staging_bytes;
    options.timeout = absl::Seconds(20);
    options.init_timeout = absl::Seconds(20);
    return options;
  }
  static std::string NewId() { return NewNcclUniqueId(FakeLibraries()).value(); }
};

TEST_F(NcclTransportFakeTest, OneRankReadbackRoundTripsAcrossPieceBoundaries) {
  auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, Options(16 << 10));
  ASSERT_OK(b);
  EXPECT_EQ((*b)->piece_bytes(), 8u << 10);
  EXPECT_TRUE((*b)->nonblocking());
  for (size_t n : {size_t{1}, size_t{8191}, size_t{8192}, size_t{8193}, size_t{3 * 8192 + 5},
                   size_t{100000}}) {
    const std::string src = RandomBytes(n, static_cast<uint32_t>(n));
    std::string readback(n, '\xEE');
    ASSERT_OK((*b)->BroadcastWithReadback(src.data(), readback.data(), n)) << n;
    EXPECT_TRUE(readback == src) << "bytes differ for n = " << n;
    std::string copy = src;
    ASSERT_OK((*b)->Broadcast(copy.data(), n)) << n;
    EXPECT_TRUE(copy == src) << "the root's buffer changed for n = " << n;
  }
  EXPECT_TRUE((*b)->healthy());
  b->reset();
  const AsympoFakeNcclStats stats = FakeStats();
  EXPECT_EQ(stats.aborts, 1);  // the destructor's
  EXPECT_EQ(stats.use_after_abort, 0);
  EXPECT_EQ(stats.live_allocations, 0);
}

TEST_F(NcclTransportFakeTest, ThreeRanksReceiveTheRootsBytesInPiecesOfTheRootsSize) {
  constexpr int kWorld = 3;
  const std::string id = NewId();
  const std::vector<size_t> buckets = {0, 1, 12345, 40000, 8192};
  std::vector<std::vector<std::string>> received(kWorld);
  std::vector<uint64_t> pieces(kWorld);
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      // Receivers ask for other staging sizes; the root's piece size wins.
      auto b = NcclBroadcaster::Create(id, rank, kWorld, 0,
                                       Options(rank == 0 ? (16 << 10) : (64 << 10) * rank));
      if (!b.ok()) {
        results[rank] = b.status();
        return;
      }
      pieces[rank] = (*b)->piece_bytes();
      for (size_t i = 0; i < buckets.size(); ++i) {
        std::string bucket = rank == 0 ? RandomBytes(buckets[i], static_cast<uint32_t>(i))
                                       : std::string(buckets[i], '\xEE');
        absl::Status status = (*b)->Broadcast(bucket.data(), bucket.size());
        if (!status.ok()) {
          results[rank] = status;
          return;
        }
        received[rank].push_back(std::move(bucket));
      }
      if (rank != 0) {
        absl::Status refused = (*b)->BroadcastWithReadback("x", nullptr, 1);
        if (refused.code() != absl::StatusCode::kFailedPrecondition || !(*b)->healthy()) {
          results[rank] = absl::InternalError("a receiver accepted BroadcastWithReadback");
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_OK(results[rank]) << "rank " << rank << ": " << results[rank];
    EXPECT_EQ(pieces[rank], 8u << 10) << "rank " << rank;
    ASSERT_EQ(received[rank].size(), buckets.size());
    for (size_t i = 0; i < buckets.size(); ++i) {
      EXPECT_TRUE(received[rank][i] == received[0][i]) << "rank " << rank << " bucket " << i;
    }
  }
  const AsympoFakeNcclStats stats = FakeStats();
  EXPECT_EQ(stats.count_mismatches, 0);
  EXPECT_EQ(stats.use_after_abort, 0);
  // 1 handshake + ceil(1/8K) + ceil(12345/8K) + ceil(40000/8K) + 1 per rank.
  EXPECT_EQ(stats.completed, kWorld * (1 + 1 + 2 + 5 + 1));
}

TEST_F(NcclTransportFakeTest, WaitsOutInProgressInitAndEnqueue) {
  AsympoFakeNcclConfig config;
  config.init_pending_polls = 5;
  config.enqueue_pending_polls = 3;
  Configure(config);
  auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, Options());
  ASSERT_OK(b);
  const std::string src = RandomBytes(30000, 1);
  std::string readback(src.size(), '\0');
  ASSERT_OK((*b)->BroadcastWithReadback(src.data(), readback.data(), src.size()));
  EXPECT_TRUE(readback == src);
  EXPECT_EQ(FakeStats().use_after_abort, 0);
}

TEST_F(NcclTransportFakeTest, WatchdogAbortsAHungBroadcastAndLaterCallsFailFast) {
  AsympoFakeNcclConfig config;
  config.hang_from_broadcast = 1;  // the handshake (number 0) completes
  Configure(config);
  NcclBroadcasterOptions options = Options();
  options.timeout = absl::Milliseconds(100);
  auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, options);
  ASSERT_OK(b);
  std::string bucket = RandomBytes(20000, 2);
  const absl::Time start = absl::Now();
  absl::Status status = (*b)->Broadcast(bucket.data(), bucket.size());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("broadcast of 20000 bytes"), HasSubstr("rank 0 of 1"),
                    HasSubstr("timed out"), HasSubstr("communicator aborted")));
  EXPECT_FALSE((*b)->healthy());
  EXPECT_EQ(FakeStats().aborts, 1);

  absl::Status again = (*b)->Broadcast(bucket.data(), bucket.size());
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(again.message(), AllOf(HasSubstr("aborted earlier"), HasSubstr("timed out")));
  b->reset();
  EXPECT_EQ(FakeStats().aborts, 1);  // never twice
  EXPECT_EQ(FakeStats().use_after_abort, 0);
  EXPECT_EQ(FakeStats().live_allocations, 0);
}

TEST_F(NcclTransportFakeTest, InitTimesOutAndAbortsWhenAPeerNeverJoins) {
  NcclBroadcasterOptions options = Options();
  options.init_timeout = absl::Milliseconds(100);
  auto b = NcclBroadcaster::Create(NewId(), 0, 2, 0, options);
  ASSERT_THAT(b, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(b.status().message(), AllOf(HasSubstr("communicator init"), HasSubstr("rank 0 of 2"),
                                          HasSubstr("aborted")));
  EXPECT_EQ(FakeStats().aborts, 1);
  EXPECT_EQ(FakeStats().live_allocations, 0);
}

TEST_F(NcclTransportFakeTest, BlockingInitOnAHelperThreadWorksAndIsAbandonedOnTimeout) {
  NcclBroadcasterOptions options = Options();
  options.nonblocking_init = false;
  {
    auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, options);
    ASSERT_OK(b);
    EXPECT_FALSE((*b)->nonblocking());
    const std::string src = RandomBytes(10000, 3);
    std::string readback(src.size(), '\0');
    ASSERT_OK((*b)->BroadcastWithReadback(src.data(), readback.data(), src.size()));
    EXPECT_TRUE(readback == src);
  }
  const int aborts_before = FakeStats().aborts;
  options.init_timeout = absl::Milliseconds(100);
  auto hung = NcclBroadcaster::Create(NewId(), 0, 2, 0, options);
  ASSERT_THAT(hung, StatusIs(absl::StatusCode::kDeadlineExceeded, "helper thread"));
  // When the stuck ncclCommInitRank finally returns, its communicator is
  // aborted by the abandoned thread.
  FakeControls::Get().release_blocked_inits();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (FakeStats().aborts == aborts_before && absl::Now() < give_up) std::this_thread::yield();
  EXPECT_EQ(FakeStats().aborts, aborts_before + 1);
  EXPECT_EQ(FakeStats().blocking_inits, 2);
}

TEST_F(NcclTransportFakeTest, AsyncErrorFromAPeerAbortsAndIsReported) {
  AsympoFakeNcclConfig config;
  config.fail_from_broadcast = 1;
  Configure(config);
  auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, Options());
  ASSERT_OK(b);
  std::string bucket = RandomBytes(5000, 4);
  const absl::Time start = absl::Now();
  absl::Status status = (*b)->Broadcast(bucket.data(), bucket.size());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the 20 s watchdog
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(status.message(), AllOf(HasSubstr("ncclRemoteError"), HasSubstr("rank 0 of 1")));
  EXPECT_FALSE((*b)->healthy());
  EXPECT_EQ(FakeStats().aborts, 1);
}

TEST_F(NcclTransportFakeTest, CancelFromAnotherThreadAbortsAWaitingBroadcast) {
  AsympoFakeNcclConfig config;
  config.hang_from_broadcast = 1;
  Configure(config);
  auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, Options());
  ASSERT_OK(b);
  NcclBroadcaster* broadcaster = b->get();
  std::thread canceller([&] {
    while (FakeStats().enqueued < 2) std::this_thread::yield();  // the bucket is in flight
    broadcaster->Cancel();
  });
  std::string bucket = RandomBytes(5000, 5);
  absl::Status status = broadcaster->Broadcast(bucket.data(), bucket.size());
  canceller.join();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(broadcaster->healthy());
  EXPECT_EQ(FakeStats().aborts, 1);
}

TEST_F(NcclTransportFakeTest, CancelWhileIdleFailsTheNextCall) {
  auto b = NcclBroadcaster::Create(NewId(), 0, 1, 0, Options());
  ASSERT_OK(b);
  (*b)->Cancel();
  std::string bucket = "abc";
  EXPECT_THAT((*b)->Broadcast(bucket.data(), bucket.size()),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE((*b)->healthy());
}

TEST_F(NcclTransportFakeTest, RejectsBadArgumentsBeforeTouchingNccl) {
  const std::string id = NewId();
  EXPECT_THAT(NcclBroadcaster::Create("short", 0, 1, 0, Options()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(NcclBroadcaster::Create(id, 2, 2, 0, Options()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(NcclBroadcaster::Create(id, 0, 1, 0, Options(100)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  absl::Status no_device = NcclBroadcaster::Create(id, 0, 1, 3, Options()).status();
  EXPECT_THAT(no_device, StatusIs(absl::StatusCode::kInvalidArgument, "only 1"));
  EXPECT_EQ(FakeStats().inits, 0);
}

TEST_F(NcclTransportFakeTest, NoCudaDeviceFailsCleanly) {
  AsympoFakeNcclConfig config;
  config.device_count = 0;
  Configure(config);
  EXPECT_FALSE(GpuAvailable(FakeLibraries()));
  absl::Status status = NcclBroadcaster::Create(NewId(), 0, 1, 0, Options()).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, "cudaErrorNoDevice"));
}

TEST_F(NcclTransportFakeTest, UniqueIdsAre128BytesAndDistinct) {
  const std::string a = NewId(), b = NewId();
  EXPECT_EQ(a.size(), 128u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace asympo::broadcast
