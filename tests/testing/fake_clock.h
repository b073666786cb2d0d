// Test helper: a clock that moves only when the test says, to test what
// expires (a rate window, a quarantine, a registration's time to live)
// without sleeping. Thread-safe: the code under test reads it from its own
// threads while the test advances it.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace asympo::testing {

class FakeClock final : public Clock {
 public:
  // Starts at a fixed, arbitrary time (not the wall clock: tests must not
  // depend on when they run).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::testing
