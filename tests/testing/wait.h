// Test helper: waits for a condition instead of sleeping a fixed time.
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asympo::testing {

// Polls `condition` every few milliseconds until it holds (true) or
// `timeout` passes (false; the condition is checked once more at the end).
template <typename Condition>
bool WaitFor(Condition condition, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

}  // namespace asympo::testing
