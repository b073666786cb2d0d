#include "rollout_server/rollout_metrics.h"

#include "common/daemon/metric_builders.h"

namespace asympo::rollout {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::AddHistogram;

RolloutMetrics::RolloutMetrics(prometheus::Registry& r)
    : tokens(AddCounter(r, "asympo_rollout_tokens_generated_total", "Response tokens sampled.")),
      groups_generated(AddCounter(r, "asympo_rollout_groups_generated_total",
                                  "Prompt groups sampled and scored.")),
      responses(AddCounter(r, "asympo_rollout_responses_total", "Responses sampled and scored.")),
      correct(AddCounter(r, "asympo_rollout_correct_responses_total",
                         "Responses the task's verifier scored as an exact match.")),
      reward_sum(AddCounter(r, "asympo_rollout_reward_sum_total",
                            "Sum of the rewards of all scored responses (divide by "
                            "asympo_rollout_responses_total for the mean).")),
      generation_seconds(AddHistogram(r, "asympo_rollout_generation_seconds",
                                      "Time of one batched generation (prompts x G responses).",
                                      {0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100})),
      flips(AddCounter(r, "asympo_rollout_weight_flips_total",
                       "Snapshots loaded into the spare model and flipped to.")),
      blocked(AddGauge(r, "asympo_rollout_generation_blocked",
                       "1 while generation waits for room in the submit buffer (the learner is "
                       "slow, full or away).")),
      blocked_seconds(AddCounter(r, "asympo_rollout_generation_blocked_seconds_total",
                                 "Time generation spent waiting for room in the submit buffer.")) {}

SubmitMetrics::SubmitMetrics(prometheus::Registry& r)
    : groups_sent(
          AddCounter(r, "asympo_rollout_groups_sent_total", "Groups the learner accepted.")),
      dropped(prometheus::BuildCounter()
                  .Name("asympo_rollout_groups_dropped_total")
                  .Help("Groups dropped without reaching the learner, by reason: rejected (the "
                        "learner refused the batch as invalid), stale (refused for their policy "
                        "version: beyond --max_policy_lag, or sampled by another learner "
                        "incarnation's weights), shutdown (still buffered when the daemon "
                        "stopped) or rewound (being sampled when the learner's version went "
                        "back, a restart from an older checkpoint).")
                  .Register(r)),
      dropped_rejected(dropped.Add({{"reason", "rejected"}})),
      dropped_stale(dropped.Add({{"reason", "stale"}})),
      dropped_shutdown(dropped.Add({{"reason", "shutdown"}})),
      dropped_rewound(dropped.Add({{"reason", "rewound"}})),
      submit_errors(prometheus::BuildCounter()
                        .Name("asympo_rollout_submit_errors_total")
                        .Help("Submit and status calls that failed, by gRPC status code.")
                        .Register(r)),
      buffer_groups(AddGauge(r, "asympo_rollout_buffer_groups",
                             "Groups generated and not yet accepted by the learner.")),
      buffer_capacity(
          AddGauge(r, "asympo_rollout_buffer_capacity_groups", "Bound of the rollout buffer.")),
      connected(AddGauge(r, "asympo_rollout_learner_connected",
                         "1 while the learner answers, 0 while the daemon reconnects.")) {}

}  // namespace asympo::rollout
