// The learner's Prometheus metrics (docs/metrics.md lists every name; they
// are a contract for dashboards and alerts), with the reward monitor
// (reward_monitor.h) behind asympo_learner_reward_ema and
// asympo_learner_collapse_suspected, the fleet's, and their per-source
// asympo_learner_source_* twins.
//
// Every asympo_learner_* family of the learner is registered here, in
// learner_metrics.cc: LearnerMetrics' own, and those of the parts that
// count for themselves (skipped steps, the source quarantine, the policy
// lag, the snapshot publisher, the listener, the authorizer), which the
// Register* functions below build and
// the daemon hands to each part. The caller owns the registry (a
// prometheus::Registry&, as everywhere in the learner); families are built
// once, at start, never on the hot path. Thread-safe: prometheus-cpp
// metrics are atomic, and ObserveStep is called by the one trainer thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/learner_service.h"
#include "learner_server/admission/policy_lag.h"
#include "learner_server/admission/source_quarantine.h"
#include "learner_server/reward_monitor.h"
#include "learner_server/trainer/skipped_steps.h"
#include "learner_server/trainer/trainer.h"

namespace asympo::learner {

class LearnerMetrics : public SubmitObserver {
 public:
  LearnerMetrics(prometheus::Registry& registry, RewardMonitorOptions rewards);

  // After every training step; `rewards`: its trained groups' rewards by
  // source (GroupRewards, less the groups the step dropped).
  void ObserveStep(const StepResult& step, const GroupQueueStats& queue,
                   const std::vector<SourceReward>& rewards);
  // Queue gauges (also refreshed by ObserveStep).
  // The version at start (restored from a checkpoint), before any step.
  void SetVersion(uint64_t version) { version_.Set(static_cast<double>(version)); }
  void ObserveQueue(const GroupQueueStats& queue);
  // SubmitObserver: one finished submission.
  void OnBatch(const std::string& source, const std::string& result, int64_t groups,
               int64_t responses, int64_t tokens) override;
  // Groups each source holds in the queue (GroupQueue::HeldBySource).
  void ObserveSources(const std::vector<std::pair<std::string, int64_t>>& held);

  // The fleet's detector; the whole monitor (for checkpoints).
  const CollapseDetector& collapse() const { return rewards_.fleet(); }
  const RewardMonitor& rewards() const { return rewards_; }
  // Restores the monitor from a checkpoint (RewardMonitor::Restore) and
  // shows its state at once, before the first step.
  absl::Status RestoreRewards(std::string_view json);

  // A checkpoint written (its version) or failed.
  void OnCheckpoint(uint64_t version) { checkpoint_version_.Set(static_cast<double>(version)); }
  void OnCheckpointFailure() { checkpoint_failures_.Increment(); }

 private:
  void RegisterBatchFamilies(prometheus::Registry& r);
  void ShowRewards();

  RewardMonitor rewards_;
  prometheus::Gauge &version_, &reward_mean_, &reward_std_, &reward_ema_, &reward_peak_, &loss_,
      &s_pos_, &s_neg_, &ratio_, &imbalance_, &clip_low_, &clip_high_, &grad_norm_, &lr_,
      &tokens_per_second_, &queue_depth_, &queue_capacity_, &queue_waiting_, &collapse_gauge_,
      &length_, &nll_, &degenerate_, &gpg_alpha_, &checkpoint_version_;
  prometheus::Counter &steps_, &tokens_, &trained_groups_, &checkpoint_failures_;
  std::map<std::string, prometheus::Counter*> batches_;  // by result
  prometheus::Counter &groups_in_, &responses_in_, &tokens_in_;
  // By source: the families, and the queued gauges set so far.
  prometheus::Family<prometheus::Counter>* source_batches_ = nullptr;
  prometheus::Family<prometheus::Counter>* source_groups_ = nullptr;
  prometheus::Family<prometheus::Gauge>* source_queued_ = nullptr;
  absl::Mutex sources_mu_;
  std::map<std::string, prometheus::Gauge*> queued_by_source_ ABSL_GUARDED_BY(sources_mu_);
  prometheus::Histogram &staleness_, &step_seconds_;
  // The reward monitor by source: the families, and the gauges by label
  // (at most max_sources + 1 labels).
  prometheus::Gauge& reward_sources_;
  prometheus::Family<prometheus::Gauge>&source_ema_, &source_peak_, &source_collapse_;
  struct SourceGauges {
    prometheus::Gauge *ema, *peak, *collapse;
  };
  std::map<std::string, SourceGauges> source_gauges_;
};

// The families of the parts that count for themselves.
// asympo_learner_steps_skipped_total{reason}, asympo_learner_skipped_groups_total.
SkippedStepCounters RegisterSkippedStepCounters(prometheus::Registry& registry);
// asympo_learner_poisoned_groups_total{source},
// asympo_learner_quarantines_total{source}, asympo_learner_quarantined_sources.
QuarantineCounters RegisterQuarantineCounters(prometheus::Registry& registry);
// asympo_learner_policy_lag and
// asympo_learner_dropped_groups_total{reason="policy_lag"} (PolicyLag).
PolicyLagMetrics RegisterPolicyLagMetrics(prometheus::Registry& registry);
// asympo_learner_snapshots_coalesced_total (SnapshotPublisher).
prometheus::Counter& RegisterSnapshotCounters(prometheus::Registry& registry);
// asympo_learner_refusals_total{code, cause}: the Authorizer counts the
// calls it refuses, and the refusals made elsewhere (quotas), in it.
prometheus::Family<prometheus::Counter>& RegisterRefusalCounters(prometheus::Registry& registry);

// What the listener did with each connection to the learner's port
// (asympo_learner_connections_total{result}), its accept errors and its
// connection limit.
struct ConnectionCounters {
  prometheus::Counter &accepted, &refused_at_limit, &refused_no_descriptors, &refused_at_peer_limit,
      &closed_unauthenticated;
  prometheus::Counter& accept_errors;  // asympo_learner_accept_errors_total
  prometheus::Gauge& max_connections;  // asympo_learner_max_connections
};
ConnectionCounters RegisterConnectionCounters(prometheus::Registry& registry);

}  // namespace asympo::learner
