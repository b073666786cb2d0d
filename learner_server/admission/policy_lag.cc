#include "learner_server/admission/policy_lag.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace asympo::learner {
namespace {

std::string GroupWhere(int g, const v1::PromptGroup& group) {
  return absl::StrCat("group ", g, " (prompt_id ", QuoteForMessage(group.prompt_id()), ")");
}

// "first_policy_version 7" or "first_policy_version 7 (last 9)".
std::string VersionsOf(const v1::Response& r) {
  std::string out = absl::StrCat("first_policy_version ", r.first_policy_version());
  if (r.has_last_policy_version()) absl::StrAppend(&out, " (last ", r.last_policy_version(), ")");
  return out;
}

absl::Status CheckNotFromTheFuture(const v1::RolloutBatch& batch, uint64_t version) {
  for (int g = 0; g < batch.groups_size(); ++g) {
    const v1::PromptGroup& group = batch.groups(g);
    for (int j = 0; j < group.responses_size(); ++j) {
      const v1::Response& r = group.responses(j);
      // last >= first (ValidateRolloutBatch), so the last is the newest.
      const uint64_t newest =
          r.has_last_policy_version() ? r.last_policy_version() : r.first_policy_version();
      if (!r.has_first_policy_version() || newest <= version) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          GroupWhere(g, group), " response ", j, ": ", VersionsOf(r),
          " is newer than the learner's version ", version,
          "; sampled by weights this learner has not made (before it restarted from an older "
          "checkpoint, or by a generator of another run): stale, dropped; sample with the "
          "learner's weights"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<uint64_t> GroupPolicyVersion(const v1::PromptGroup& group) {
  std::optional<uint64_t> oldest;
  for (const v1::Response& r : group.responses()) {
    if (!r.has_first_policy_version()) continue;
    if (!oldest.has_value() || r.first_policy_version() < *oldest) {
      oldest = r.first_policy_version();
    }
  }
  return oldest;
}

AdmissionResult CheckPolicyVersions(const v1::RolloutBatch& batch, uint64_t version,
                                    int64_t max_lag) {
  // Another incarnation's (or run's) version: stale like a lagging group,
  // never invalid: the batch itself is well formed.
  if (absl::Status s = CheckNotFromTheFuture(batch, version); !s.ok()) {
    return AdmissionResult::Refused(AdmissionOutcome::kPolicyLag, std::move(s));
  }
  if (max_lag <= 0) return AdmissionResult::Accepted();
  for (int g = 0; g < batch.groups_size(); ++g) {
    const std::optional<uint64_t> v = GroupPolicyVersion(batch.groups(g));
    if (!v.has_value() || LagAt(*v, version) <= static_cast<uint64_t>(max_lag)) continue;
    return AdmissionResult::Refused(
        AdmissionOutcome::kPolicyLag,
        absl::FailedPreconditionError(absl::StrCat(
            GroupWhere(g, batch.groups(g)), ": sampled by policy version ", *v,
            " (its oldest first_policy_version), ", LagAt(*v, version),
            " versions behind the learner's version ", version, ", more than its --max_policy_lag ",
            max_lag, "; sample with newer weights")));
  }
  return AdmissionResult::Accepted();
}

std::vector<GroupLag> LagsOf(const std::vector<QueuedGroup>& groups, uint64_t version) {
  std::vector<GroupLag> out;
  out.reserve(groups.size());
  for (const QueuedGroup& q : groups) {
    const std::optional<uint64_t> v = GroupPolicyVersion(q.group);
    out.push_back(
        {q.source, v.has_value() ? std::optional<uint64_t>(LagAt(*v, version)) : std::nullopt});
  }
  return out;
}

PolicyLag::PolicyLag(int64_t max_lag, PolicyLagMetrics metrics)
    : max_lag_(std::max<int64_t>(max_lag, 0)), metrics_(metrics) {}

bool PolicyLag::Behind(const QueuedGroup& group, uint64_t version) const {
  if (max_lag_ == 0) return false;
  const std::optional<uint64_t> v = GroupPolicyVersion(group.group);
  return v.has_value() && LagAt(*v, version) > static_cast<uint64_t>(max_lag_);
}

void PolicyLag::CountRefused(const std::string& source) {
  absl::MutexLock lock(&mu_);
  ++rejected_;
  ++sources_[source].rejected;
}

int64_t PolicyLag::DropBehind(GroupQueue& queue, uint64_t version) {
  if (max_lag_ == 0) return 0;
  const std::vector<QueuedGroup> removed =
      queue.RemoveIf([&](const QueuedGroup& g) { return Behind(g, version); });
  CountDropped(removed, version);
  return static_cast<int64_t>(removed.size());
}

int64_t PolicyLag::DropPopped(std::vector<QueuedGroup>* groups, uint64_t version) {
  if (max_lag_ == 0) return 0;
  std::vector<QueuedGroup> kept, removed;
  for (QueuedGroup& g : *groups) (Behind(g, version) ? removed : kept).push_back(std::move(g));
  *groups = std::move(kept);
  CountDropped(removed, version);
  return static_cast<int64_t>(removed.size());
}

void PolicyLag::CountDropped(const std::vector<QueuedGroup>& removed, uint64_t version) {
  if (removed.empty()) return;
  metrics_.dropped.Increment(static_cast<double>(removed.size()));
  {
    absl::MutexLock lock(&mu_);
    dropped_ += removed.size();
    for (const QueuedGroup& g : removed) ++sources_[g.source].dropped;
  }
  if (int64_t held_back = 0; drop_log_.Allow(&held_back)) {
    const QueuedGroup& first = removed.front();
    LOG(WARNING) << removed.size() << " queued groups fell more than --max_policy_lag " << max_lag_
                 << " versions behind the learner's version " << version
                 << " and were dropped untrained (the first: prompt_id "
                 << QuoteForMessage(first.group.prompt_id()) << " of source "
                 << QuoteForMessage(first.source) << ", policy version "
                 << GroupPolicyVersion(first.group).value_or(0)
                 << "; asympo_learner_dropped_groups_total)" << drop_log_.HeldBack(held_back);
  }
}

void PolicyLag::ObserveTrained(const std::vector<GroupLag>& lags,
                               const std::vector<size_t>& dropped) {
  absl::MutexLock lock(&mu_);
  size_t next = 0;  // into `dropped`
  for (size_t i = 0; i < lags.size(); ++i) {
    if (next < dropped.size() && dropped[next] == i) {
      ++next;
      continue;
    }
    if (!lags[i].lag.has_value()) continue;
    const uint64_t lag = *lags[i].lag;
    metrics_.lag.Observe(static_cast<double>(lag));
    SourceLag& s = sources_[lags[i].source];
    ++s.trained;
    s.last = lag;
    s.max = std::max(s.max, lag);
    s.sum += static_cast<double>(lag);
  }
}

void PolicyLag::Fill(v1::LearnerStatus* status) const {
  absl::MutexLock lock(&mu_);
  status->set_max_policy_lag(static_cast<uint64_t>(max_lag_));
  status->set_rejected_lag_batches(rejected_);
  status->set_dropped_lag_groups(dropped_);
  for (const auto& [source, s] : sources_) {
    v1::SourcePolicyLag* out = status->add_source_policy_lags();
    out->set_source(source);
    out->set_trained_groups(s.trained);
    out->set_last_lag(s.last);
    out->set_mean_lag(s.trained > 0 ? s.sum / static_cast<double>(s.trained) : 0);
    out->set_max_lag(s.max);
    out->set_rejected_batches(s.rejected);
    out->set_dropped_groups(s.dropped);
  }
}

}  // namespace asympo::learner
