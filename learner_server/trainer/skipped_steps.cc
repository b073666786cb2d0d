#include "learner_server/trainer/skipped_steps.h"

#include <glog/logging.h>

namespace asympo::learner {

SkippedSteps::SkippedSteps(SkippedStepCounters counters, absl::Duration log_interval)
    : log_interval_(log_interval), steps_(counters.steps), groups_(counters.groups) {
  // Every reason is exported from the start, at 0, so that rate() and
  // alerts see the series before the first failure.
  absl::MutexLock lock(&mu_);
  for (const SkipReason reason : kSkipReasons) {
    reasons_[reason].steps = &steps_.Add({{"reason", std::string(SkipReasonLabel(reason))}});
  }
}

void SkippedSteps::Record(const StepFailure& failure, int64_t groups) {
  const absl::string_view reason = SkipReasonLabel(failure.reason);
  const absl::Status& error = failure.status;
  groups_.Increment(static_cast<double>(groups));
  absl::MutexLock lock(&mu_);
  PerReason& r = reasons_[failure.reason];  // registered by the constructor
  r.steps->Increment();
  ++r.count;
  ++r.since_log;
  const absl::Time now = absl::Now();
  if (now - r.last_log < log_interval_) return;
  if (r.logged == 0) {
    LOG(ERROR) << "step skipped (" << reason << "), " << groups
               << " groups not trained on: " << error.message();
  } else {
    LOG(ERROR) << r.since_log << " steps skipped (" << reason << ") in the last "
               << absl::FormatDuration(now - r.last_log) << "; the latest: " << error.message();
  }
  ++r.logged;
  r.since_log = 0;
  r.last_log = now;
}

int64_t SkippedSteps::total() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [reason, r] : reasons_) total += r.count;
  return total;
}

int64_t SkippedSteps::count(SkipReason reason) const {
  absl::MutexLock lock(&mu_);
  auto it = reasons_.find(reason);
  return it == reasons_.end() ? 0 : it->second.count;
}

int64_t SkippedSteps::logged(SkipReason reason) const {
  absl::MutexLock lock(&mu_);
  auto it = reasons_.find(reason);
  return it == reasons_.end() ? 0 : it->second.logged;
}

}  // namespace asympo::learner
