// A clock to read the time from, so that what expires (a rate window, a
// quarantine, an unsubscribed registration) can be tested without waiting.
// Production code takes a `const Clock*` in its options, defaulting to
// RealClock() (absl::Now()); tests pass a tests/testing/fake_clock.h
// FakeClock and advance it. Thread-safe: Now() may be called from any thread.
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asympo {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock. Lives for the whole program (never destroyed).
inline const Clock* RealClock() {
  class Real final : public Clock {
   public:
    absl::Time Now() const override { return absl::Now(); }
  };
  static const Real* const real = new Real;
  return real;
}

}  // namespace asympo
