// Learning-rate schedules: linear warm-up, then constant or cosine decay.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace asympo::learner {

struct LrScheduleOptions {
  double peak_lr = 1e-6;
  // Steps of linear warm-up from peak_lr / warmup_steps to peak_lr.
  int64_t warmup_steps = 0;
  // "constant" or "cosine" (from peak_lr down to min_lr_ratio * peak_lr at
  // total_steps, then held there).
  std::string kind = "constant";
  int64_t total_steps = 0;
  double min_lr_ratio = 0.1;
};

// Names the bad option: a non-positive or non-finite peak_lr, negative
// warm-up, an unknown kind, cosine without total_steps > warmup_steps, a
// ratio outside [0, 1].
absl::Status ValidateLrSchedule(const LrScheduleOptions& options);

// The learning rate of optimizer step `step` (0-based).
double LearningRate(const LrScheduleOptions& options, int64_t step);

}  // namespace asympo::learner
