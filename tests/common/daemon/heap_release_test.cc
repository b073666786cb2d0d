#include "common/daemon/heap_release.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/daemon/daemon_runtime.h"
#include "tests/testing/metrics.h"
#include "tests/testing/wait.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ASYMPO_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ASYMPO_SANITIZER_ALLOCATOR 1
#endif
#endif

namespace asympo::daemon {
namespace {

using ::asympo::testing::MetricValue;

constexpr int64_t kMiB = int64_t{1} << 20;

// What a burst of large requests leaves behind: `mib` MiB allocated and
// touched on a thread of its own (an arena of its own, as a gRPC reader
// thread), in 1 MiB blocks each followed by a small block that stays
// allocated, so that glibc cannot give the memory back itself by trimming
// the top of a heap. FreeBlocks frees the big blocks (the burst is over),
// FreePins the small ones.
struct Burst {
  explicit Burst(int mib) {
    std::thread([&] {
      for (int i = 0; i < mib; ++i) {
        blocks.push_back(std::malloc(kMiB));
        std::memset(blocks.back(), 1, kMiB);
        pins.push_back(std::malloc(64));
      }
    }).join();
  }
  void FreeBlocks() {
    for (void* block : blocks) std::free(block);
    blocks.clear();
  }
  ~Burst() {
    FreeBlocks();
    for (void* pin : pins) std::free(pin);
  }
  std::vector<void*> blocks;
  std::vector<void*> pins;
};

class HeapReleaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef ASYMPO_SANITIZER_ALLOCATOR
    GTEST_SKIP() << "a sanitizer's allocator is not glibc's: nothing to release";
#endif
    RetainFreedMemory();  // the daemons' settings: glibc keeps what is freed
  }
};

// A releaser whose thread does not check while the test does.
struct Releaser {
  explicit Releaser(int64_t keep_bytes) : releaser(Options(keep_bytes), registry, "asympo_test") {}
  static HeapReleaseOptions Options(int64_t keep_bytes) {
    HeapReleaseOptions o;
    o.keep_bytes = keep_bytes;
    o.interval = absl::Hours(1);
    return o;
  }
  prometheus::Registry registry;
  HeapReleaser releaser;
};

TEST_F(HeapReleaseTest, GivesFreedPagesBackAboveTheLimit) {
  Releaser r(64 * kMiB);
  Burst burst(320);
  burst.FreeBlocks();
  const int64_t before = ResidentBytes();
  const HeapRelease release = r.releaser.Check();
  const int64_t after = ResidentBytes();
  EXPECT_GE(release.free_bytes, release.idle_bytes);
  EXPECT_GE(release.idle_bytes, 96 * kMiB);
  EXPECT_TRUE(release.released);
  EXPECT_GE(release.released_bytes, 96 * kMiB)
      << "resident before " << before << ", after " << after;
  EXPECT_LE(after, before - 96 * kMiB);
  EXPECT_EQ(MetricValue(r.registry, "asympo_test_heap_released_bytes_total"),
            static_cast<double>(release.released_bytes));
  EXPECT_NEAR(MetricValue(r.registry, "asympo_test_resident_memory_bytes"),
              static_cast<double>(after), 16.0 * kMiB);
}

TEST_F(HeapReleaseTest, KeepsFreedMemoryUpToTheLimit) {
  Releaser r(256 * kMiB);
  Burst burst(128);
  burst.FreeBlocks();
  const int64_t before = ResidentBytes();
  const HeapRelease release = r.releaser.Check();
  const int64_t after = ResidentBytes();
  EXPECT_FALSE(release.released);
  EXPECT_EQ(release.released_bytes, 0);
  EXPECT_GE(after, before - 16 * kMiB) << "the freed memory stays resident for reuse";
  EXPECT_EQ(MetricValue(r.registry, "asympo_test_heap_released_bytes_total"), 0);
}

TEST_F(HeapReleaseTest, DoesNotReleaseAgainWhatItGaveBack) {
  Releaser r(64 * kMiB);
  Burst burst(320);
  burst.FreeBlocks();
  const HeapRelease first = r.releaser.Check();
  const HeapRelease second = r.releaser.Check();
  EXPECT_TRUE(first.released);
  EXPECT_GE(second.free_bytes, 64 * kMiB) << "the heap still has the free pages, not resident";
  EXPECT_LT(second.idle_bytes, 64 * kMiB);
  EXPECT_FALSE(second.released);
}

// A burst still in flight at a check is released at the next one, once it
// is freed.
TEST_F(HeapReleaseTest, ReleasesWhatIsFreedAfterACheck) {
  Releaser r(64 * kMiB);
  Burst burst(320);
  const HeapRelease in_flight = r.releaser.Check();
  burst.FreeBlocks();
  const HeapRelease freed = r.releaser.Check();
  EXPECT_FALSE(in_flight.released);
  EXPECT_TRUE(freed.released);
  EXPECT_GE(freed.released_bytes, 96 * kMiB);
}

// Resident memory from outside malloc (a device runtime's pinned buffers,
// say) looks like freed heap memory when the heap has free pages that are
// not resident: it costs one needless release at most, not one per check.
TEST_F(HeapReleaseTest, GrowthOutsideTheHeapCostsOneReleaseAtMost) {
  {
    Burst burst(128);  // free heap pages that are not resident
    burst.FreeBlocks();
    Releaser(0).releaser.Check();
  }
  Releaser r(64 * kMiB);
  const size_t size = 320 * kMiB;
  void* outside = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(outside, MAP_FAILED);
  std::memset(outside, 1, size);
  const HeapRelease first = r.releaser.Check();
  const HeapRelease second = r.releaser.Check();
  ::munmap(outside, size);
  EXPECT_LE(first.idle_bytes, first.free_bytes);
  EXPECT_FALSE(second.released);
}

// With the bytes of the requests received: only what requests can have
// left behind is released, not what the daemon's own work frees for reuse.
TEST_F(HeapReleaseTest, WithRequestBytesReleasesOnlyWhatRequestsCanHaveLeft) {
  std::atomic<int64_t> received{5 * kMiB};
  prometheus::Registry registry;
  HeapReleaseOptions options;
  options.keep_bytes = 64 * kMiB;
  options.interval = absl::Hours(1);
  options.received_window = absl::Hours(1);  // each check counts what came in since the last
  options.received_bytes = [&received] { return received.load(); };
  HeapReleaser releaser(options, registry, "asympo_test");
  Burst burst(320);
  burst.FreeBlocks();  // the daemon's own work: 320 MiB freed for reuse
  const HeapRelease own = releaser.Check();
  EXPECT_GE(own.idle_bytes, 96 * kMiB);
  EXPECT_EQ(own.received_bytes, 0);
  EXPECT_FALSE(own.released);
  received += 16 * kMiB;  // a few requests: far less than the excess
  const HeapRelease few = releaser.Check();
  EXPECT_EQ(few.received_bytes, 16 * kMiB);
  EXPECT_FALSE(few.released);
  received += 400 * kMiB;  // a burst of large requests
  const HeapRelease burst_over = releaser.Check();
  EXPECT_EQ(burst_over.received_bytes, 400 * kMiB);
  EXPECT_TRUE(burst_over.released);
  EXPECT_GE(burst_over.released_bytes, 96 * kMiB);
  Burst again(320);  // the requests are out of the window now
  again.FreeBlocks();
  const HeapRelease after = releaser.Check();
  EXPECT_EQ(after.received_bytes, 0);
  EXPECT_FALSE(after.released);
}

// Requests are counted when they arrive and their memory is freed when they
// are answered: a burst that spans checks is released once it is over, as
// long as it is within the window; after that, freed memory is kept again.
TEST_F(HeapReleaseTest, RequestsCountForTheWholeWindow) {
  std::atomic<int64_t> received{0};
  prometheus::Registry registry;
  HeapReleaseOptions options;
  options.keep_bytes = 64 * kMiB;
  options.interval = absl::Hours(1);
  options.received_window = absl::Hours(2);  // the last two checks
  options.received_bytes = [&received] { return received.load(); };
  HeapReleaser releaser(options, registry, "asympo_test");
  {
    Burst burst(320);
    received += 320 * kMiB;  // counted on arrival, still in use at this check
    EXPECT_FALSE(releaser.Check().released);
    burst.FreeBlocks();
    const HeapRelease answered = releaser.Check();
    EXPECT_EQ(answered.received_bytes, 320 * kMiB);
    EXPECT_TRUE(answered.released);
  }
  EXPECT_EQ(releaser.Check().received_bytes, 0);  // the window has passed
  Burst own(320);                                 // the daemon's own work
  own.FreeBlocks();
  EXPECT_FALSE(releaser.Check().released);
}

TEST_F(HeapReleaseTest, ItsThreadReleasesAndCountsIt) {
  prometheus::Registry registry;
  HeapReleaseOptions options;
  options.keep_bytes = 64 * kMiB;
  options.interval = absl::Milliseconds(20);
  HeapReleaser releaser(options, registry, "asympo_test");
  Burst burst(256);
  burst.FreeBlocks();
  EXPECT_TRUE(asympo::testing::WaitFor([&] {
    return MetricValue(registry, "asympo_test_heap_released_bytes_total") >= 96.0 * kMiB;
  })) << MetricValue(registry, "asympo_test_heap_released_bytes_total");
}

TEST_F(HeapReleaseTest, StopsAtOnceNotAfterTheInterval) {
  const absl::Time start = absl::Now();
  { Releaser r(64 * kMiB); }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace asympo::daemon
