#include "learner_server/step_log.h"

#include <cerrno>
#include <cstring>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<StepLog>> StepLog::Open(const std::string& csv_path,
                                                       absl::Duration log_every) {
  std::unique_ptr<StepLog> log(new StepLog(log_every));
  if (!csv_path.empty()) {
    log->csv_.open(csv_path, std::ios::out | std::ios::app);
    if (!log->csv_.is_open()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot open step_csv_path ", csv_path, ": ", std::strerror(errno)));
    }
    log->csv_.seekp(0, std::ios::end);
    if (log->csv_.tellp() == 0) {
      log->csv_ << "time_s,step,version,reward_mean,reward_std,loss,s_pos,s_neg,grad_norm,lr,"
                   "tokens_per_s,queue_depth,staleness_mean,mean_response_length\n"
                << std::flush;
    }
  }
  log->start_time_ = absl::Now();
  return log;
}

void StepLog::Write(int64_t steps, uint64_t total_steps, const StepResult& step,
                    const GroupQueueStats& queue, bool collapse_suspected) {
  WriteCsv(total_steps, step, queue);
  Log(steps, step, queue, collapse_suspected);
}

void StepLog::WriteCsv(uint64_t total_steps, const StepResult& step, const GroupQueueStats& queue) {
  if (!csv_.is_open()) return;
  double staleness = 0;
  for (uint64_t s : step.staleness) staleness += static_cast<double>(s);
  if (!step.staleness.empty()) staleness /= static_cast<double>(step.staleness.size());
  const LossDiagnostics& d = step.diagnostics;
  csv_ << absl::StrFormat("%.3f,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.1f,%d,%.3f,%.3f\n",
                          absl::ToDoubleSeconds(absl::Now() - start_time_), total_steps,
                          step.version, d.reward_mean, d.reward_std, d.loss, d.s_pos, d.s_neg,
                          step.grad_norm, step.learning_rate,
                          step.seconds > 0 ? static_cast<double>(step.tokens) / step.seconds : 0.0,
                          static_cast<int>(queue.depth_groups), staleness, d.mean_response_length)
       << std::flush;
}

void StepLog::Log(int64_t steps, const StepResult& step, const GroupQueueStats& q, bool collapse) {
  const absl::Time now = absl::Now();
  // A collapse suspicion that begins is logged at once, at most once an
  // interval too (the suspicion can come and go step by step).
  const bool collapse_begins =
      collapse && !logged_collapse_ && now - last_collapse_log_ >= log_every_;
  if (steps > 10 && now - last_step_log_ < log_every_ && !collapse_begins) return;
  last_step_log_ = now;
  logged_collapse_ = collapse;
  if (collapse_begins) last_collapse_log_ = now;
  const LossDiagnostics& d = step.diagnostics;
  LOG(INFO) << absl::StrFormat(
      "step %d version %d reward %.4f loss %.5f S_P %.3f S_N %.3f grad %.3f lr %.2e "
      "tokens/s %.0f queue %d/%d%s",
      steps, step.version, d.reward_mean, d.loss, d.s_pos, d.s_neg, step.grad_norm,
      step.learning_rate, step.seconds > 0 ? step.tokens / step.seconds : 0.0, q.depth_groups,
      q.capacity_groups, collapse ? " COLLAPSE SUSPECTED" : "");
}

}  // namespace asympo::learner
