#include "common/daemon/heap_release.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <glog/logging.h>

#include "common/daemon/metric_builders.h"

namespace asympo::daemon {
namespace {

// The heap as glibc counts it, and the process's resident memory.
struct HeapSample {
  int64_t free_bytes = 0;
  int64_t in_use_bytes = 0;  // live allocations, mmap'ed ones included
  int64_t resident_bytes = 0;
  // Resident memory that live allocations do not account for.
  int64_t Unaccounted() const { return resident_bytes - in_use_bytes; }
};

HeapSample Sample() {
  const struct mallinfo2 info = mallinfo2();
  HeapSample s;
  s.free_bytes = static_cast<int64_t>(info.fordblks);
  s.in_use_bytes = static_cast<int64_t>(info.uordblks + info.hblkhd);
  s.resident_bytes = ResidentBytes();
  return s;
}

}  // namespace

int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0;
  long long resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  if (read != 2) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

HeapReleaser::HeapReleaser(HeapReleaseOptions options, prometheus::Registry& registry,
                           const std::string& prefix)
    : options_(options),
      resident_bytes_(metrics::AddGauge(registry, prefix + "_resident_memory_bytes",
                                        "Resident memory of the process at the last check")),
      released_bytes_(metrics::AddCounter(
          registry, prefix + "_heap_released_bytes_total",
          "Resident memory given back to the kernel once more freed heap memory than "
          "--free_heap_limit_mib stayed resident")) {
  const HeapSample s = Sample();
  floor_ = s.Unaccounted();
  if (options_.received_bytes) received_at_.push_back(options_.received_bytes());
  resident_bytes_.Set(static_cast<double>(s.resident_bytes));
  thread_ = std::thread([this] { Loop(); });
}

HeapReleaser::~HeapReleaser() {
  stop_.Notify();
  thread_.join();
}

HeapRelease HeapReleaser::Check() {
  absl::MutexLock lock(&mu_);
  const HeapSample s = Sample();
  floor_ = std::min(floor_, s.Unaccounted());
  HeapRelease r;
  if (options_.received_bytes) {
    const size_t intervals =
        static_cast<size_t>(std::max<int64_t>(1, options_.received_window / options_.interval));
    received_at_.push_back(options_.received_bytes());
    while (received_at_.size() > intervals + 1) received_at_.pop_front();
    r.received_bytes = received_at_.back() - received_at_.front();
  }
  r.free_bytes = s.free_bytes;
  r.idle_bytes = std::clamp<int64_t>(s.Unaccounted() - floor_, 0, s.free_bytes);
  resident_bytes_.Set(static_cast<double>(s.resident_bytes));
  if (r.idle_bytes <= options_.keep_bytes) return r;  // idle_bytes <= free_bytes
  if (options_.received_bytes && r.received_bytes < (r.idle_bytes - options_.keep_bytes) / 2) {
    return r;
  }
  malloc_trim(0);
  const HeapSample after = Sample();
  r.released = true;
  r.released_bytes = std::max<int64_t>(0, s.resident_bytes - after.resident_bytes);
  floor_ = after.Unaccounted();
  resident_bytes_.Set(static_cast<double>(after.resident_bytes));
  released_bytes_.Increment(static_cast<double>(r.released_bytes));
  return r;
}

void HeapReleaser::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.interval)) {
    const HeapRelease r = Check();
    if (r.released_bytes >= (int64_t{64} << 20)) {
      LOG(INFO) << "gave " << (r.released_bytes >> 20)
                << " MiB of freed memory back to the kernel (" << (r.idle_bytes >> 20)
                << " MiB of freed heap memory was resident, more than the "
                << (options_.keep_bytes >> 20) << " MiB kept for reuse)";
    }
  }
}

}  // namespace asympo::daemon
