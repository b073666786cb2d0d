#include "learner_server/admission/source_quarantine.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace asympo::learner {

absl::Status ValidateQuarantineOptions(const QuarantineOptions& o) {
  if (o.max_poisoned_groups < 0 || o.max_poisoned_groups > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quarantine_after_groups=", o.max_poisoned_groups, ": expected 0 to 1000000"));
  }
  for (const auto& [flag, d] :
       {std::pair<const char*, absl::Duration>{"quarantine_window", o.window},
        {"quarantine_duration", o.duration}}) {
    if (d < absl::Seconds(1) || d > absl::Hours(24 * 7)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", absl::FormatDuration(d), ": expected 1s to 168h"));
    }
  }
  return absl::OkStatus();
}

SourceQuarantine::SourceQuarantine(QuarantineOptions options, QuarantineCounters counters)
    : options_(options),
      poisoned_(counters.poisoned),
      quarantines_(counters.quarantines),
      quarantined_(counters.quarantined) {}

bool SourceQuarantine::RecordPoisoned(const std::string& source, int64_t groups, absl::Time now) {
  poisoned_.Add({{"source", source}}).Increment(static_cast<double>(groups));
  if (options_.max_poisoned_groups == 0) return false;
  absl::MutexLock lock(&mu_);
  Record& r = sources_[source];
  for (int64_t i = 0; i < groups; ++i) r.poisoned.push_back(now);
  while (!r.poisoned.empty() && r.poisoned.front() <= now - options_.window) {
    r.poisoned.pop_front();
  }
  const bool starts =
      r.until <= now && static_cast<int64_t>(r.poisoned.size()) >= options_.max_poisoned_groups;
  if (starts) {
    r.until = now + options_.duration;
    r.poisoned.clear();
    quarantines_.Add({{"source", source}}).Increment();
  }
  UpdateGauge(now);
  return starts;
}

absl::Status SourceQuarantine::Admit(const std::string& source, absl::Time now,
                                     absl::Duration* retry_after) {
  absl::MutexLock lock(&mu_);
  auto it = sources_.find(source);
  if (it == sources_.end() || it->second.until <= now) {
    UpdateGauge(now);
    return absl::OkStatus();
  }
  *retry_after = it->second.until - now;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "source %s is refused until %s: %d of its groups made training steps non-finite within "
      "%s (--quarantine_after_groups, --quarantine_window); retry after the hint",
      QuoteForMessage(source),
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", it->second.until, absl::UTCTimeZone()),
      options_.max_poisoned_groups, absl::FormatDuration(options_.window)));
}

void SourceQuarantine::UpdateGauge(absl::Time now) {
  int64_t n = 0;
  for (auto it = sources_.begin(); it != sources_.end();) {
    if (it->second.until > now) ++n;
    // Nothing to remember: no quarantine and no poison left in the window.
    if (it->second.until <= now &&
        (it->second.poisoned.empty() || it->second.poisoned.back() <= now - options_.window)) {
      sources_.erase(it++);
    } else {
      ++it;
    }
  }
  quarantined_.Set(static_cast<double>(n));
}

}  // namespace asympo::learner
