// The true policy lag of what the learner trains on: measured, reported by
// source, and bounded when asked (--max_policy_lag; docs/protocol.md,
// "Policy lag").
//
// A group's policy version is the oldest Response.first_policy_version of
// its responses (GroupPolicyVersion): the oldest weights that sampled any
// of it. A group none of whose responses carries one (an external
// generator that does not know) has none: it is neither measured nor
// bounded. When a step trains on a group, its lag is the step's training
// version (the weights the step's gradient is computed on: the learner's
// version before the step) minus the group's policy version. Queue
// staleness (asympo_learner_staleness_versions) counts only the versions a
// group waited in the queue; the lag adds the time it was generated and
// the time its generator took to fetch newer weights.
//
// Admission (CheckPolicyVersions, from LearnerService::Prepare): a version
// above the learner's is kInvalid (INVALID_ARGUMENT); with a bound K > 0, a
// group more than K versions behind is kPolicyLag (FAILED_PRECONDITION),
// and the whole batch is refused. Before each step the trainer thread drops the
// queued groups that fell more than K behind while they waited
// (DropBehind), and any such group the step popped (DropPopped: one queued
// between the check at admission and a version change); each is counted by
// source, in asympo_learner_dropped_groups_total{reason="policy_lag"} and a
// throttled log line, never silently.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "asympo/v1/learner.pb.h"
#include "asympo/v1/rollout.pb.h"
#include "common/log_throttle.h"
#include "learner_server/admission/admission_result.h"
#include "learner_server/admission/group_queue.h"

namespace asympo::learner {

// The oldest first_policy_version of the group's responses; nullopt when
// none of them carries one.
std::optional<uint64_t> GroupPolicyVersion(const v1::PromptGroup& group);

// The lag of a group of policy version `policy_version` trained at
// `version` (0 when the group is not older).
inline uint64_t LagAt(uint64_t policy_version, uint64_t version) {
  return version > policy_version ? version - policy_version : 0;
}

// Checks `batch`'s policy versions against the learner's current `version`
// (their own rules are ValidateRolloutBatch's): kInvalid naming the group,
// the response, its versions and the learner's when a version is above
// `version`; with `max_lag` > 0, kPolicyLag naming the group, its version,
// the learner's and the bound when a group is more than `max_lag` behind;
// else kAccepted. Every response is checked for the first before any group
// for the second.
AdmissionResult CheckPolicyVersions(const v1::RolloutBatch& batch, uint64_t version,
                                    int64_t max_lag);

// The families PolicyLag counts in (registered in learner_metrics.cc).
struct PolicyLagMetrics {
  prometheus::Histogram& lag;    // asympo_learner_policy_lag
  prometheus::Counter& dropped;  // asympo_learner_dropped_groups_total{reason="policy_lag"}
};

// One group of a step, before the step takes it.
struct GroupLag {
  std::string source;
  std::optional<uint64_t> lag;  // nullopt: the group carried no policy version
};

// Each group's source and lag at `version`.
std::vector<GroupLag> LagsOf(const std::vector<QueuedGroup>& groups, uint64_t version);

class PolicyLag {
 public:
  // `max_lag`: the bound K in versions (0: none).
  PolicyLag(int64_t max_lag, PolicyLagMetrics metrics);

  int64_t max_lag() const { return max_lag_; }
  // Whether `group` is more than the bound behind `version` (never without
  // a bound, or without a policy version).
  bool Behind(const QueuedGroup& group, uint64_t version) const;

  // A batch of `source` refused for the bound.
  void CountRefused(const std::string& source);
  // Removes from `queue` the queued groups behind the bound at `version`
  // (the next step's training version) and counts them; returns how many.
  int64_t DropBehind(GroupQueue& queue, uint64_t version);
  // The same for the groups a step popped: those behind the bound are
  // removed from `groups` (the others keep their order) and counted.
  int64_t DropPopped(std::vector<QueuedGroup>* groups, uint64_t version);
  // After a step trained: the lags of its groups (LagsOf, taken before the
  // step), except those at the indices `dropped` (sorted; the groups the
  // step dropped as poisoned), into the histogram and the per-source
  // figures.
  void ObserveTrained(const std::vector<GroupLag>& lags, const std::vector<size_t>& dropped);

  // Sets LearnerStatus' max_policy_lag, rejected_lag_batches,
  // dropped_lag_groups and source_policy_lags.
  void Fill(v1::LearnerStatus* status) const;

 private:
  struct SourceLag {
    uint64_t trained = 0, last = 0, max = 0, rejected = 0, dropped = 0;
    double sum = 0;
  };
  // Counts groups of `removed` dropped at `version`, with a log line.
  void CountDropped(const std::vector<QueuedGroup>& removed, uint64_t version);

  const int64_t max_lag_;
  PolicyLagMetrics metrics_;
  LogThrottle drop_log_;
  mutable absl::Mutex mu_;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, SourceLag> sources_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::learner
