#include "learner_server/admission_watch.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/daemon/metric_builders.h"

namespace asympo::learner {

using metrics::AddCounter;
using metrics::AddGauge;

AdmissionWatch::AdmissionWatch(prometheus::Registry& r, int64_t step_groups,
                               absl::Duration partial_after)
    : step_groups_(step_groups),
      partial_after_(partial_after),
      waiting_groups_(AddGauge(r, "asympo_learner_queue_waiting_groups",
                               "Groups of the submissions waiting for room in the queue.")),
      largest_waiting_(AddGauge(r, "asympo_learner_queue_largest_waiting_groups",
                                "Groups of the largest submission waiting for room in the queue.")),
      oldest_wait_(AddGauge(r, "asympo_learner_queue_oldest_wait_seconds",
                            "How long the oldest submission waiting for room has waited (0: none "
                            "waits).")),
      short_steps_(AddCounter(r, "asympo_learner_short_steps_total",
                              "Steps trained with fewer than --prompts_per_step groups, after "
                              "--partial_step_after without a full step.")),
      short_step_groups_(AddCounter(r, "asympo_learner_short_step_groups_total",
                                    "Groups trained by short steps.")) {}

void AdmissionWatch::OnNoStep(const GroupQueueStats& q) {
  waiting_groups_.Set(static_cast<double>(q.waiting_groups));
  largest_waiting_.Set(static_cast<double>(q.largest_waiting));
  oldest_wait_.Set(absl::ToDoubleSeconds(q.oldest_wait));
  int64_t held_back = 0;
  if (q.waiting_pushes > 0 && q.oldest_wait >= kReportAfter && waiting_log_.Allow(&held_back)) {
    LOG(WARNING) << "admission: " << q.waiting_pushes << " submission(s) of " << q.waiting_groups
                 << " groups (the largest " << q.largest_waiting << ") have waited up to "
                 << absl::FormatDuration(absl::Trunc(q.oldest_wait, absl::Seconds(1)))
                 << " for room in the queue: " << q.depth_groups << " of " << q.capacity_groups
                 << " groups are queued and a step takes " << step_groups_
                 << (partial_after_ > absl::ZeroDuration()
                         ? absl::StrCat(" (fewer are trained as a short step after ",
                                        absl::FormatDuration(partial_after_), ", or ",
                                        absl::FormatDuration(kBlockedFor),
                                        " once a submission waits for room)")
                         : std::string(" (--partial_step_after=0: steps are always whole)"))
                 << waiting_log_.HeldBack(held_back);
  }
}

void AdmissionWatch::OnShortStep(int64_t groups) {
  short_steps_.Increment();
  short_step_groups_.Increment(static_cast<double>(groups));
  int64_t held_back = 0;
  if (short_log_.Allow(&held_back)) {
    LOG(INFO) << "short step: " << groups << " of " << step_groups_ << " groups, queued for over "
              << absl::FormatDuration(partial_after_)
              << " without a full step (--partial_step_after), or while a submission waited for "
                 "room; each weighs as in a full step"
              << short_log_.HeldBack(held_back);
  }
}

}  // namespace asympo::learner
