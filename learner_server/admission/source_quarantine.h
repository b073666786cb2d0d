// Sources whose groups keep poisoning training steps are refused at
// admission for a while.
//
// A poisoned group is one the trainer dropped from its step because it made
// the loss or the gradient non-finite by itself (StepResult::dropped). One
// costs only itself; a source that sends `max_poisoned_groups` of them
// within `window` is quarantined for `duration`: its batches are refused
// with RESOURCE_EXHAUSTED and a retry hint of the time left, before they
// are parsed, so that it neither takes queue room from honest sources nor
// makes the trainer try groups one by one step after step. The source is
// the principal's name (without an authorizer every caller is
// "anonymous", one source).
//
// Metrics: asympo_learner_poisoned_groups_total{source},
// asympo_learner_quarantined_sources (sources refused now) and
// asympo_learner_quarantines_total{source}. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asympo::learner {

struct QuarantineOptions {
  // 0: never quarantine (poisoned groups are still dropped and counted).
  int64_t max_poisoned_groups = 3;
  absl::Duration window = absl::Minutes(10);
  absl::Duration duration = absl::Minutes(10);
};

// INVALID_ARGUMENT naming the flag: max_poisoned_groups in [0, 1000000],
// window and duration in [1s, 7 days].
absl::Status ValidateQuarantineOptions(const QuarantineOptions& options);

// What SourceQuarantine counts in, registered with the learner's other
// metrics (RegisterQuarantineCounters, learner_metrics.h).
struct QuarantineCounters {
  prometheus::Family<prometheus::Counter>& poisoned;     // by source
  prometheus::Family<prometheus::Counter>& quarantines;  // by source
  prometheus::Gauge& quarantined;
};

class SourceQuarantine {
 public:
  SourceQuarantine(QuarantineOptions options, QuarantineCounters counters);

  // Records `groups` poisoned groups of `source` at `now`. Returns true
  // when this starts a quarantine of the source.
  bool RecordPoisoned(const std::string& source, int64_t groups, absl::Time now);
  // OK, or RESOURCE_EXHAUSTED naming the source, why and until when, with
  // *retry_after set to the time left.
  absl::Status Admit(const std::string& source, absl::Time now, absl::Duration* retry_after);

 private:
  struct Record {
    std::deque<absl::Time> poisoned;  // within the window
    absl::Time until = absl::InfinitePast();
  };
  void UpdateGauge(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const QuarantineOptions options_;
  prometheus::Family<prometheus::Counter>& poisoned_;
  prometheus::Family<prometheus::Counter>& quarantines_;
  prometheus::Gauge& quarantined_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Record> sources_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::learner
