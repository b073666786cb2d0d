// The documented range of every numeric flag (integers, floating point and
// durations) that a program's main file defines, checked at start.
//
//   ABSL_FLAG(double, lr, 1e-6, "Peak learning rate.");
//   ASYMPO_FLAG_RANGE(lr, 0, 1);
//   ABSL_FLAG(absl::Duration, retry_after, absl::Seconds(1), "...");
//   ASYMPO_DURATION_FLAG_RANGE(retry_after, absl::Milliseconds(1), absl::Minutes(10));
//
// ParseFlagsAndStartLogging (common/flag_usage.h) refuses a value outside
// its flag's inclusive range ("--lr=1e+09: expected 0 to 1"; the programs
// exit 2), and --help shows each range beside the default. A numeric flag
// of the main file without a range is a defect of the build: --help and
// the start both name it. Registration happens during static
// initialisation; the rest is thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace asympo {

bool RegisterFlagRange(const char* name, double lo, double hi);
bool RegisterDurationFlagRange(const char* name, absl::Duration lo, absl::Duration hi);

// "0 to 1", "1s to 10m"; empty for a flag without a range.
std::string FlagRangeText(absl::string_view name);

// INVALID_ARGUMENT "--NAME=VALUE: expected LO to HI" for the first flag out
// of its range, or naming a numeric flag of `main_file` (a path suffix, as
// SetProgramUsage takes) that has none.
absl::Status CheckFlagRanges(absl::string_view main_file);

}  // namespace asympo

#define ASYMPO_FLAG_RANGE(name, lo, hi)                         \
  [[maybe_unused]] static const bool asympo_flag_range_##name = \
      ::asympo::RegisterFlagRange(#name, (lo), (hi))
#define ASYMPO_DURATION_FLAG_RANGE(name, lo, hi)                \
  [[maybe_unused]] static const bool asympo_flag_range_##name = \
      ::asympo::RegisterDurationFlagRange(#name, (lo), (hi))
