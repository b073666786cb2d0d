// Training steps that failed and were skipped: counted by reason
// (asympo_learner_steps_skipped_total{reason}, with the groups they consumed
// in asympo_learner_skipped_groups_total) and logged without flooding the
// log: the first failure of a reason at once, later ones at most once per
// log_interval, with how many were skipped meanwhile.
//
// The reasons are SkipReasons (skip_reason.h), labelled alike. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "learner_server/trainer/skip_reason.h"

namespace asympo::learner {

// What SkippedSteps counts in, registered with the learner's other metrics
// (RegisterSkippedStepCounters, learner_metrics.h).
struct SkippedStepCounters {
  prometheus::Family<prometheus::Counter>& steps;  // by reason
  prometheus::Counter& groups;
};

class SkippedSteps {
 public:
  explicit SkippedSteps(SkippedStepCounters counters,
                        absl::Duration log_interval = absl::Minutes(1));

  // A step failed with `failure` after its `groups` groups were taken from
  // the queue (they are not trained on).
  void Record(const StepFailure& failure, int64_t groups);

  // Steps skipped, in all and for one reason; log lines written for a
  // reason (for tests).
  int64_t total() const;
  int64_t count(SkipReason reason) const;
  int64_t logged(SkipReason reason) const;

 private:
  struct PerReason {
    prometheus::Counter* steps = nullptr;
    int64_t count = 0;
    int64_t logged = 0;
    int64_t since_log = 0;  // skipped since the last log line
    absl::Time last_log = absl::InfinitePast();
  };

  const absl::Duration log_interval_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Counter& groups_;
  mutable absl::Mutex mu_;
  std::map<SkipReason, PerReason> reasons_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::learner
