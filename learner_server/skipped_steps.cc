#include "learner_server/skipped_steps.h"

#include <glog/logging.h>

#include "learner_server/trainer.h"

namespace asympo::learner {

SkippedSteps::SkippedSteps(SkippedStepCounters counters, absl::Duration log_interval)
    : log_interval_(log_interval), steps_(counters.steps), groups_(counters.groups) {
  // Every reason is exported from the start, at 0, so that rate() and
  // alerts see the series before the first failure.
  absl::MutexLock lock(&mu_);
  for (const char* reason : {kSkipNonFiniteLoss, kSkipNonFiniteGradient, kSkipInvalidBatch,
                             kSkipOutOfMemory, kSkipTorchError, kSkipPoisonedGroups}) {
    reasons_[reason].steps = &steps_.Add({{"reason", reason}});
  }
}

void SkippedSteps::Record(const absl::Status& error, int64_t groups) {
  const std::string reason = StepSkipReason(error);
  groups_.Increment(static_cast<double>(groups));
  absl::MutexLock lock(&mu_);
  PerReason& r = reasons_[reason];
  if (r.steps == nullptr) r.steps = &steps_.Add({{"reason", reason}});
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

int64_t SkippedSteps::count(const std::string& reason) const {
  absl::MutexLock lock(&mu_);
  auto it = reasons_.find(reason);
  return it == reasons_.end() ? 0 : it->second.count;
}

int64_t SkippedSteps::logged(const std::string& reason) const {
  absl::MutexLock lock(&mu_);
  auto it = reasons_.find(reason);
  return it == reasons_.end() ? 0 : it->second.logged;
}

}  // namespace asympo::learner
