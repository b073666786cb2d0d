// Gives freed heap memory back to the kernel once a daemon holds more of it
// than it needs.
//
// RetainFreedMemory (daemon_runtime.h) keeps what a daemon frees for its
// next allocations: glibc trims an arena only when more than 256 MiB sits
// at its top. That pays for steady reuse, but a burst of large requests
// leaves their memory resident for good: gRPC receives each message into
// buffers taken from the arena of the thread that reads it, so 40 invalid
// 60 MB Submits left asympo-learner at 1.5 GiB (from 170 MiB), spread over
// the arenas of two reader threads.
//
// A HeapReleaser checks every `interval` how much freed heap memory is still
// resident and, above `keep_bytes`, gives every free page back to the kernel
// (malloc_trim). glibc says how much of the heap is free (mallinfo2), not
// how much of that is resident, so the releaser estimates it: resident
// memory that live allocations do not account for (code, stacks, memory
// from outside malloc, and free heap pages) rises by what is freed and
// stays resident, measured from its lowest level since the last release.
// So a burst is released once, whether it is still in flight at a check or
// not, and free pages already given back are not released again and again.
// Memory that is then reused is faulted in again at most once per interval,
// not once per step as with glibc's defaults.
//
// A daemon whose own work frees large buffers at a high rate (a training
// step on the CPU frees its activations and gradients: 300-500 MiB a step
// on a 100M-parameter model) would then lose that reuse too. Given the
// bytes of the requests it has received (`received_bytes`), the releaser
// releases only what requests can have left behind: when at least half the
// excess over `keep_bytes` has come in within `received_window` (a request
// is counted when it arrives, and its memory freed when it is answered,
// seconds later for a burst).
//
// A build with a sanitizer has its own allocator: it never releases.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace asympo::daemon {

struct HeapReleaseOptions {
  // Freed heap memory kept resident for reuse; above it, it is released.
  int64_t keep_bytes = int64_t{256} << 20;
  absl::Duration interval = absl::Seconds(2);
  // The bytes of the requests received so far (a running total), or empty:
  // then any excess is released.
  std::function<int64_t()> received_bytes;
  // How far back received bytes count, in whole intervals (at least one).
  absl::Duration received_window = absl::Seconds(30);
};

// What one check found and did.
struct HeapRelease {
  int64_t free_bytes = 0;      // heap bytes free for reuse, resident or not
  int64_t idle_bytes = 0;      // of them, the estimate of those resident
  int64_t received_bytes = 0;  // request bytes received within the window
  // Both above keep_bytes (and, with received_bytes, enough requests came
  // in for half the excess): malloc_trim ran.
  bool released = false;
  int64_t released_bytes = 0;  // the fall in resident memory it caused, >= 0
};

// Resident memory of this process (/proc/self/statm), 0 if unreadable.
int64_t ResidentBytes();

class HeapReleaser {
 public:
  // Starts the thread; the estimate starts from this moment. Registers
  // <prefix>_resident_memory_bytes (at the last check) and
  // <prefix>_heap_released_bytes_total in `registry`.
  HeapReleaser(HeapReleaseOptions options, prometheus::Registry& registry,
               const std::string& prefix);
  // Stops the thread (at once, not after the interval).
  ~HeapReleaser();
  HeapReleaser(const HeapReleaser&) = delete;
  HeapReleaser& operator=(const HeapReleaser&) = delete;

  // One check, now, on the calling thread (the thread's checks call it).
  HeapRelease Check();

 private:
  void Loop();

  const HeapReleaseOptions options_;
  prometheus::Gauge& resident_bytes_;
  prometheus::Counter& released_bytes_;
  absl::Mutex mu_;
  // The lowest resident memory not in live allocations since the last
  // release: what the process holds besides its free heap pages.
  int64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  // The running total of received bytes at each of the last checks, newest
  // last: as many as the window has intervals, plus one.
  std::deque<int64_t> received_at_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace asympo::daemon
