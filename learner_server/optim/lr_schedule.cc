#include "learner_server/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace asympo::learner {

absl::Status ValidateLrSchedule(const LrScheduleOptions& o) {
  if (!(o.peak_lr > 0) || !std::isfinite(o.peak_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate is ", o.peak_lr, "; it must be positive and finite"));
  }
  if (o.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps is ", o.warmup_steps, "; it must be >= 0"));
  }
  if (o.kind != "constant" && o.kind != "cosine") {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr_schedule=", o.kind, ": expected constant or cosine"));
  }
  if (o.kind == "cosine" && o.total_steps <= o.warmup_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr_schedule=cosine needs --total_steps=", o.total_steps,
                     " above --warmup_steps=", o.warmup_steps));
  }
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_lr_ratio is ", o.min_lr_ratio, "; it must be in [0, 1]"));
  }
  return absl::OkStatus();
}

double LearningRate(const LrScheduleOptions& o, int64_t step) {
  if (step < o.warmup_steps) {
    return o.peak_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  if (o.kind == "constant") return o.peak_lr;
  const double span = static_cast<double>(o.total_steps - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
  const double cosine = 0.5 * (1 + std::cos(3.14159265358979323846 * progress));
  return o.peak_lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * cosine);
}

}  // namespace asympo::learner
