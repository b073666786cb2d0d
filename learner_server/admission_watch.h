// What the learner's admission waits on, said while it waits: the trainer
// loop hands it the queue's figures whenever it finds no full step, and it
// keeps the gauges of the waiting submissions current (a stalled learner
// takes no steps, so no step refreshes them), counts the short steps, and
// logs, at most once per interval, why training is not moving: submissions
// waiting for queue room, or a short step's groups waiting for
// --partial_step_after.
//
// Not thread-safe: the trainer thread's.
#pragma once

#include <cstdint>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/time/time.h"
#include "common/log_throttle.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/step_intake.h"

namespace asympo::learner {

class AdmissionWatch {
 public:
  // `step_groups`: --prompts_per_step; `partial_after`: --partial_step_after.
  AdmissionWatch(prometheus::Registry& registry, int64_t step_groups, absl::Duration partial_after);

  // The trainer found fewer than a step's groups (`q`: the queue now).
  void OnNoStep(const GroupQueueStats& q);
  // A short step took `groups` (fewer than a step's).
  void OnShortStep(int64_t groups);

  // A waiting submission is reported once it has waited this long.
  static constexpr absl::Duration kReportAfter = absl::Seconds(10);

 private:
  const int64_t step_groups_;
  const absl::Duration partial_after_;
  prometheus::Gauge &waiting_groups_, &largest_waiting_, &oldest_wait_;
  prometheus::Counter &short_steps_, &short_step_groups_;
  LogThrottle waiting_log_{absl::Seconds(30)};
  LogThrottle short_log_{absl::Seconds(60)};
};

}  // namespace asympo::learner
