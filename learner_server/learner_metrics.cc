#include "learner_server/learner_metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/daemon/metric_builders.h"
#include "common/status_macros.h"
#include "learner_server/admission/admission_result.h"

namespace asympo::learner {
namespace {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::AddHistogram;

}  // namespace

LearnerMetrics::LearnerMetrics(prometheus::Registry& r, RewardMonitorOptions rewards)
    : rewards_(rewards),
      version_(AddGauge(r, "asympo_learner_version", "Policy version: optimizer steps applied.")),
      reward_mean_(
          AddGauge(r, "asympo_learner_reward_mean", "Mean reward of the last step's responses.")),
      reward_std_(AddGauge(r, "asympo_learner_reward_std", "Std of the last step's rewards.")),
      reward_ema_(AddGauge(r, "asympo_learner_reward_ema",
                           "The fleet's reward EMA: the median over the active sources' "
                           "EMAs of their step rewards.")),
      reward_peak_(AddGauge(r, "asympo_learner_reward_ema_peak",
                            "Running peak of the fleet's reward EMA since warm-up (kept in "
                            "checkpoints).")),
      loss_(AddGauge(r, "asympo_learner_loss", "Objective value of the last step.")),
      s_pos_(AddGauge(r, "asympo_learner_scale_positive",
                      "S_P: advantage-weighted mean NLL of positive responses.")),
      s_neg_(AddGauge(r, "asympo_learner_scale_negative",
                      "S_N: advantage-weighted mean NLL of negative responses.")),
      ratio_(AddGauge(r, "asympo_learner_naive_ratio", "R = S_N / S_P.")),
      imbalance_(AddGauge(r, "asympo_learner_imbalance", "Mean over groups of sum_g A_g S_g.")),
      clip_low_(AddGauge(r, "asympo_learner_clip_fraction", "Fraction of tokens at a clip bound.",
                         {{"bound", "low"}})),
      clip_high_(AddGauge(r, "asympo_learner_clip_fraction", "Fraction of tokens at a clip bound.",
                          {{"bound", "high"}})),
      grad_norm_(AddGauge(r, "asympo_learner_grad_norm", "Global gradient norm before clipping.")),
      lr_(AddGauge(r, "asympo_learner_learning_rate", "Learning rate of the last step.")),
      tokens_per_second_(AddGauge(r, "asympo_learner_tokens_per_second",
                                  "Prompt + response tokens per second of the last step.")),
      queue_depth_(
          AddGauge(r, "asympo_learner_queue_depth_groups", "Groups waiting in the queue.")),
      queue_capacity_(
          AddGauge(r, "asympo_learner_queue_capacity_groups", "Queue capacity K in groups.")),
      queue_waiting_(AddGauge(r, "asympo_learner_queue_waiting_submissions",
                              "Submissions held while the queue is full.")),
      collapse_gauge_(AddGauge(r, "asympo_learner_collapse_suspected",
                               "1 when the fleet's reward EMA fell the set fraction below its "
                               "peak.")),
      length_(AddGauge(r, "asympo_learner_mean_response_length_tokens", "Mean response length.")),
      nll_(AddGauge(r, "asympo_learner_mean_nll", "Mean token NLL (an entropy proxy).")),
      degenerate_(AddGauge(r, "asympo_learner_degenerate_group_fraction",
                           "Fraction of groups whose rewards are all equal.")),
      gpg_alpha_(AddGauge(r, "asympo_learner_gpg_alpha", "GPG's gradient correction B/(B-M).")),
      checkpoint_version_(AddGauge(r, "asympo_learner_checkpoint_version",
                                   "Version of the newest checkpoint written or restored (0: "
                                   "none).")),
      steps_(AddCounter(r, "asympo_learner_steps_total", "Training steps completed.")),
      tokens_(AddCounter(r, "asympo_learner_tokens_total", "Prompt + response tokens trained on.")),
      trained_groups_(AddCounter(r, "asympo_learner_trained_groups_total", "Groups trained on.")),
      checkpoint_failures_(AddCounter(r, "asympo_learner_checkpoint_failures_total",
                                      "Checkpoints (or exports) that could not be written.")),
      groups_in_(AddCounter(r, "asympo_learner_accepted_groups_total", "Groups accepted.")),
      responses_in_(
          AddCounter(r, "asympo_learner_accepted_responses_total", "Responses accepted.")),
      tokens_in_(
          AddCounter(r, "asympo_learner_received_tokens_total",
                     "Prompt + response tokens of submitted batches, whatever their result.")),
      staleness_(AddHistogram(r, "asympo_learner_staleness_versions",
                              "Learner versions between a group's arrival and its use in a step.",
                              {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64})),
      step_seconds_(AddHistogram(r, "asympo_learner_step_duration_seconds",
                                 "Wall time of a training step.",
                                 {0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300})),
      reward_sources_(AddGauge(r, "asympo_learner_reward_sources",
                               "Sources whose reward EMA counts in the fleet's median.")),
      source_ema_(prometheus::BuildGauge()
                      .Name("asympo_learner_source_reward_ema")
                      .Help("Reward EMA by source (the sources beyond "
                            "--collapse_max_sources share \"(other)\").")
                      .Register(r)),
      source_peak_(prometheus::BuildGauge()
                       .Name("asympo_learner_source_reward_ema_peak")
                       .Help("Running peak of a source's reward EMA since its warm-up.")
                       .Register(r)),
      source_collapse_(prometheus::BuildGauge()
                           .Name("asympo_learner_source_collapse_suspected")
                           .Help("1 when a source's reward EMA fell the set fraction below "
                                 "its peak.")
                           .Register(r)) {
  RegisterBatchFamilies(r);
}

// The batch and source families: labelled by result and by source.
void LearnerMetrics::RegisterBatchFamilies(prometheus::Registry& r) {
  auto& batches = prometheus::BuildCounter()
                      .Name("asympo_learner_batches_total")
                      .Help(
                          "Submitted batches by result: accepted, duplicate (a batch_id "
                          "accepted before: answered OK, not queued again), "
                          "batch_id_conflict (a batch_id accepted before with another "
                          "payload: refused), invalid, full, quota (the source over its share "
                          "or rate), policy_lag (a group more than --max_policy_lag versions "
                          "behind), unavailable.")
                      .Register(r);
  // Every label a batch's result can take (OutcomeLabel; kCancelled shares
  // kUnavailable's).
  for (AdmissionOutcome o :
       {AdmissionOutcome::kAccepted, AdmissionOutcome::kDuplicate,
        AdmissionOutcome::kBatchIdConflict, AdmissionOutcome::kInvalid, AdmissionOutcome::kFull,
        AdmissionOutcome::kQuota, AdmissionOutcome::kPolicyLag, AdmissionOutcome::kUnavailable}) {
    const std::string result(OutcomeLabel(o));
    batches_[result] = &batches.Add({{"result", result}});
  }
  source_batches_ = &prometheus::BuildCounter()
                         .Name("asympo_learner_source_batches_total")
                         .Help(
                             "Submitted batches by source (the caller's principal, "
                             "\"anonymous\" without authentication) and result.")
                         .Register(r);
  source_groups_ = &prometheus::BuildCounter()
                        .Name("asympo_learner_source_groups_total")
                        .Help("Groups accepted, by source.")
                        .Register(r);
  source_queued_ = &prometheus::BuildGauge()
                        .Name("asympo_learner_source_queued_groups")
                        .Help(
                            "Groups queued or waiting for room, by source (its quota share "
                            "bounds this).")
                        .Register(r);
}

void LearnerMetrics::ObserveSources(const std::vector<std::pair<std::string, int64_t>>& held) {
  absl::MutexLock lock(&sources_mu_);
  for (auto& [source, gauge] : queued_by_source_) gauge->Set(0);
  for (const auto& [source, groups] : held) {
    prometheus::Gauge*& g = queued_by_source_[source];
    if (g == nullptr) g = &source_queued_->Add({{"source", source}});
    g->Set(static_cast<double>(groups));
  }
}

void LearnerMetrics::ObserveQueue(const GroupQueueStats& q) {
  queue_depth_.Set(static_cast<double>(q.depth_groups));
  queue_capacity_.Set(static_cast<double>(q.capacity_groups));
  queue_waiting_.Set(static_cast<double>(q.waiting_pushes));
}

// The monitor's state on the gauges: the fleet's, and each source's (a
// label's gauges are added once, when its source first appears).
void LearnerMetrics::ShowRewards() {
  const CollapseDetector& fleet = rewards_.fleet();
  collapse_gauge_.Set(fleet.suspected() ? 1 : 0);
  reward_ema_.Set(fleet.ema());
  reward_peak_.Set(fleet.peak());
  reward_sources_.Set(rewards_.active_sources());
  for (const auto& [label, source] : rewards_.sources()) {
    auto it = source_gauges_.find(label);
    if (it == source_gauges_.end()) {
      const std::map<std::string, std::string> labels{{"source", label}};
      it = source_gauges_
               .emplace(label, SourceGauges{&source_ema_.Add(labels), &source_peak_.Add(labels),
                                            &source_collapse_.Add(labels)})
               .first;
    }
    it->second.ema->Set(source.detector.ema());
    it->second.peak->Set(source.detector.peak());
    it->second.collapse->Set(source.detector.suspected() ? 1 : 0);
  }
}

absl::Status LearnerMetrics::RestoreRewards(std::string_view json) {
  ASYMPO_RETURN_IF_ERROR(rewards_.Restore(json));
  ShowRewards();
  return absl::OkStatus();
}

void LearnerMetrics::ObserveStep(const StepResult& s, const GroupQueueStats& q,
                                 const std::vector<SourceReward>& rewards) {
  const LossDiagnostics& d = s.diagnostics;
  version_.Set(static_cast<double>(s.version));
  steps_.Increment();
  tokens_.Increment(static_cast<double>(s.tokens));
  trained_groups_.Increment(static_cast<double>(d.groups));
  reward_mean_.Set(d.reward_mean);
  reward_std_.Set(d.reward_std);
  rewards_.Observe(rewards);
  ShowRewards();
  loss_.Set(d.loss);
  s_pos_.Set(d.s_pos);
  s_neg_.Set(d.s_neg);
  ratio_.Set(d.naive_ratio);
  imbalance_.Set(d.imbalance);
  clip_low_.Set(d.clip_low_fraction);
  clip_high_.Set(d.clip_high_fraction);
  grad_norm_.Set(s.grad_norm);
  lr_.Set(s.learning_rate);
  tokens_per_second_.Set(s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0);
  length_.Set(d.mean_response_length);
  nll_.Set(d.mean_nll);
  degenerate_.Set(d.degenerate_group_fraction);
  gpg_alpha_.Set(d.gpg_alpha);
  for (uint64_t v : s.staleness) staleness_.Observe(static_cast<double>(v));
  step_seconds_.Observe(s.seconds);
  ObserveQueue(q);
}

void LearnerMetrics::OnBatch(const std::string& source, const std::string& result, int64_t groups,
                             int64_t responses, int64_t tokens) {
  auto it = batches_.find(result);
  if (it != batches_.end()) it->second->Increment();
  tokens_in_.Increment(static_cast<double>(tokens));
  source_batches_->Add({{"source", source}, {"result", result}}).Increment();
  if (result == "accepted") {
    groups_in_.Increment(static_cast<double>(groups));
    responses_in_.Increment(static_cast<double>(responses));
    source_groups_->Add({{"source", source}}).Increment(static_cast<double>(groups));
  }
}

SkippedStepCounters RegisterSkippedStepCounters(prometheus::Registry& r) {
  return {prometheus::BuildCounter()
              .Name("asympo_learner_steps_skipped_total")
              .Help("Training steps that failed and were skipped (weights, optimizer and "
                    "version unchanged), by reason: nonfinite_loss, nonfinite_gradient, "
                    "invalid_batch, out_of_memory, torch_error.")
              .Register(r),
          AddCounter(r, "asympo_learner_skipped_groups_total",
                     "Groups taken from the queue by skipped steps (not trained on).")};
}

QuarantineCounters RegisterQuarantineCounters(prometheus::Registry& r) {
  return {prometheus::BuildCounter()
              .Name("asympo_learner_poisoned_groups_total")
              .Help("Groups dropped from their step because each alone made the loss or "
                    "the gradient non-finite, by source")
              .Register(r),
          prometheus::BuildCounter()
              .Name("asympo_learner_quarantines_total")
              .Help("Times a source was refused for a while for sending poisoned "
                    "groups (--quarantine_after_groups), by source")
              .Register(r),
          AddGauge(r, "asympo_learner_quarantined_sources",
                   "Sources whose batches are refused now for sending "
                   "poisoned groups")};
}

PolicyLagMetrics RegisterPolicyLagMetrics(prometheus::Registry& r) {
  return {AddHistogram(r, "asympo_learner_policy_lag",
                       "Per trained group that carries Response.first_policy_version: the "
                       "step's training version minus the group's oldest first_policy_version.",
                       {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64}),
          prometheus::BuildCounter()
              .Name("asympo_learner_dropped_groups_total")
              .Help("Accepted groups dropped from the queue untrained, by reason: policy_lag "
                    "(fell more than --max_policy_lag versions behind while queued).")
              .Register(r)
              .Add({{"reason", "policy_lag"}})};
}

prometheus::Counter& RegisterSnapshotCounters(prometheus::Registry& r) {
  return AddCounter(
      r, "asympo_learner_snapshots_coalesced_total",
      "Versions staged for broadcast but replaced by a newer one before the publisher thread "
      "picked them up (it fell behind the trainer).");
}

prometheus::Family<prometheus::Counter>& RegisterRefusalCounters(prometheus::Registry& r) {
  return prometheus::BuildCounter()
      .Name("asympo_learner_refusals_total")
      .Help(
          "Calls refused before any work, by gRPC code and cause (bad or missing "
          "credentials, a missing role, a quota)")
      .Register(r);
}

ConnectionCounters RegisterConnectionCounters(prometheus::Registry& r) {
  auto& family = prometheus::BuildCounter()
                     .Name("asympo_learner_connections_total")
                     .Help(
                         "Connections to the learner's port, by what became of them: accepted, "
                         "refused_at_limit (--max_connections open), refused_at_peer_limit "
                         "(--max_connections_per_peer open from its address), "
                         "closed_unauthenticated (no authorized call within "
                         "--connection_auth_grace, or its place taken at a limit), "
                         "refused_no_descriptors (the process was out of file descriptors)")
                     .Register(r);
  return {family.Add({{"result", "accepted"}}),
          family.Add({{"result", "refused_at_limit"}}),
          family.Add({{"result", "refused_no_descriptors"}}),
          family.Add({{"result", "refused_at_peer_limit"}}),
          family.Add({{"result", "closed_unauthenticated"}}),
          AddCounter(r, "asympo_learner_accept_errors_total",
                     "accept4 failures on the learner's port: running out of file "
                     "descriptors (EMFILE, ENFILE) or kernel memory; accepting pauses"),
          AddGauge(r, "asympo_learner_max_connections",
                   "Connections to the learner's port that may be open at once "
                   "(--max_connections)")};
}

}  // namespace asympo::learner
