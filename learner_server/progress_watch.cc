#include "learner_server/progress_watch.h"

#include "absl/strings/str_cat.h"

namespace asympo::learner {

ProgressWatch::ProgressWatch(absl::Duration stall, int64_t step_groups, absl::Time start,
                             absl::Duration partial_after)
    : stall_(stall),
      step_groups_(step_groups),
      partial_after_(partial_after),
      round_(start),
      moved_(start) {}

void ProgressWatch::CameRound(const GroupQueueStats& q, absl::Time now) {
  const int64_t motion = q.accepted_groups + q.popped_groups + q.removed_groups;
  const bool waits = q.depth_groups >= step_groups_ || q.waiting_pushes > 0 ||
                     (partial_after_ > absl::ZeroDuration() && q.depth_groups > 0);
  absl::MutexLock lock(&mu_);
  round_ = now;
  if (motion != motion_ || !waits) moved_ = now;
  motion_ = motion;
  depth_ = q.depth_groups;
  waiting_ = q.waiting_pushes;
}

absl::Status ProgressWatch::Check(absl::Time now) const {
  if (stall_ <= absl::ZeroDuration()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (now - round_ > stall_) {
    return absl::UnavailableError(
        absl::StrCat("the training loop has not come round for ",
                     absl::FormatDuration(absl::Trunc(now - round_, absl::Seconds(1))),
                     " (over --ready_stall_timeout=", absl::FormatDuration(stall_),
                     "): a step, a checkpoint or a collective is stuck"));
  }
  // Groups short of a step wait up to partial_after for their short step.
  const bool short_only = depth_ < step_groups_ && waiting_ == 0;
  if (now - moved_ > stall_ + (short_only ? partial_after_ : absl::ZeroDuration())) {
    return absl::UnavailableError(
        absl::StrCat(depth_, " groups are queued (a step takes ", step_groups_, ") and ", waiting_,
                     " submissions wait for room, but the queue has not moved for ",
                     absl::FormatDuration(now - moved_),
                     " (over --ready_stall_timeout=", absl::FormatDuration(stall_), ")"));
  }
  return absl::OkStatus();
}

}  // namespace asympo::learner
