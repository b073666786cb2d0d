// Rank 0's record of its trained steps: the per-step INFO line and the step
// CSV (--step_csv).
//
// The log line is written for every step of the first 10, then at most once
// per `log_every`, and when a collapse suspicion begins (at most once an
// interval too: the suspicion can come and go step by step); zero: every
// step. The CSV, when there is one, gets a row for every step, flushed at
// once; a new or empty file first gets the header. Not thread-safe: the
// trainer thread's.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/trainer/trainer.h"

namespace asympo::learner {

class StepLog {
 public:
  // Opens `csv_path` for appending (empty: no CSV); INVALID_ARGUMENT naming
  // it when it cannot be opened. The CSV's time column counts from here.
  static absl::StatusOr<std::unique_ptr<StepLog>> Open(const std::string& csv_path,
                                                       absl::Duration log_every);

  // One trained step: the `steps`-th of this run, the `total_steps`-th
  // counted since the process started (the CSV's step column), with the
  // queue after it and whether a reward collapse is suspected now.
  void Write(int64_t steps, uint64_t total_steps, const StepResult& step,
             const GroupQueueStats& queue, bool collapse_suspected);

 private:
  explicit StepLog(absl::Duration log_every) : log_every_(log_every) {}
  void WriteCsv(uint64_t total_steps, const StepResult& step, const GroupQueueStats& queue);
  void Log(int64_t steps, const StepResult& step, const GroupQueueStats& queue, bool collapse);

  const absl::Duration log_every_;
  std::ofstream csv_;  // not open: no CSV
  absl::Time start_time_;
  absl::Time last_step_log_ = absl::InfinitePast();
  absl::Time last_collapse_log_ = absl::InfinitePast();
  bool logged_collapse_ = false;
};

}  // namespace asympo::learner
