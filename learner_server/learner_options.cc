#include "learner_server/learner_options.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo::learner {

absl::Status ValidateLearnerDaemonOptions(const LearnerDaemonOptions& o) {
  if (o.prompts_per_step <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts_per_step=", o.prompts_per_step, ": it must be positive"));
  }
  if (o.queue.capacity_groups < o.prompts_per_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--queue_capacity=", o.queue.capacity_groups,
        " is below --prompts_per_step=", o.prompts_per_step, ": a step could never be filled"));
  }
  if (o.partial_step_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial_step_after is ", absl::FormatDuration(o.partial_step_after),
                     "; it must be >= 0 (0: steps are always whole)"));
  }
  if (o.service.limits.max_groups_per_batch > o.queue.capacity_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_groups_per_batch=", o.service.limits.max_groups_per_batch,
                     " exceeds --queue_capacity=", o.queue.capacity_groups,
                     ": such a batch could never be queued"));
  }
  if (o.queue.batch_id_window < o.queue.capacity_groups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch_id_window=", o.queue.batch_id_window, " is below --queue_capacity=",
        o.queue.capacity_groups, ": every batch with a queued group must be remembered"));
  }
  if (o.max_connections < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_connections=", o.max_connections, ": it must be >= 0 (0: default)"));
  }
  if (o.max_policy_lag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_policy_lag=", o.max_policy_lag, ": it must be >= 0 (0: no bound)"));
  }
  if (o.broadcast_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--broadcast_every=", o.broadcast_every, ": it must be >= 0"));
  }
  ASYMPO_RETURN_IF_ERROR(ValidateRewardMonitorOptions(RewardMonitorOptionsOf(o)));
  ASYMPO_RETURN_IF_ERROR(ValidateQuarantineOptions(o.quarantine));
  return ValidateTrainerOptions(o.trainer);
}

}  // namespace asympo::learner
