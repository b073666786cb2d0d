#include "learner_server/admission/source_rates.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace asympo::learner {

namespace {

double Capacity(double groups_per_second, int64_t burst_groups) {
  return std::max(groups_per_second, static_cast<double>(burst_groups));
}

}  // namespace

absl::Status SourceRates::Admit(const std::string& source, double groups_per_second, int64_t groups,
                                absl::Time now, absl::Duration* retry_after) {
  if (groups_per_second <= 0) return absl::OkStatus();
  const double capacity = Capacity(groups_per_second, burst_groups_);
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = buckets_.try_emplace(source);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = capacity;
  } else {
    b.tokens =
        std::min(capacity, b.tokens + absl::ToDoubleSeconds(now - b.last) * groups_per_second);
  }
  b.last = now;
  const double need = static_cast<double>(groups);
  if (b.tokens >= need) {
    b.tokens -= need;
    return absl::OkStatus();
  }
  *retry_after = absl::Milliseconds(std::ceil(1000.0 * (need - b.tokens) / groups_per_second));
  return absl::ResourceExhaustedError(
      absl::StrFormat("source %s is over its rate of %g groups per second; retry after the hint",
                      QuoteForMessage(source), groups_per_second));
}

void SourceRates::Refund(const std::string& source, double groups_per_second, int64_t groups) {
  if (groups_per_second <= 0) return;
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(source);
  if (it == buckets_.end()) return;
  it->second.tokens = std::min(Capacity(groups_per_second, burst_groups_),
                               it->second.tokens + static_cast<double>(groups));
}

}  // namespace asympo::learner
