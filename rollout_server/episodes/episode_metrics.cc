#include "rollout_server/episodes/episode_metrics.h"

#include "common/daemon/metric_builders.h"

namespace asympo::rollout {

using metrics::AddCounter;
using metrics::AddHistogram;

EpisodeMetrics::EpisodeMetrics(prometheus::Registry& r, GenerationCounters counters)
    : generation(counters),
      episodes(AddCounter(r, "asympo_rollout_episodes_total",
                          "Multi-turn episodes the environment ended (done).")),
      failed(prometheus::BuildCounter()
                 .Name("asympo_rollout_episodes_failed_total")
                 .Help("Multi-turn episodes ended by a failure, by reason: deadline (a call "
                       "past --environment_timeout), unavailable (the environment cannot be "
                       "reached), refused (UNAUTHENTICATED or PERMISSION_DENIED: the daemon "
                       "stops), error (another error status), invalid_answer (an answer "
                       "that breaks the protocol), overlong (appended tokens beyond the "
                       "response budget), not_done (a final turn not answered done). The "
                       "episode's group is dropped.")
                 .Register(r)),
      dropped(counters.dropped->Add({{"reason", "environment"}})),
      turns(AddHistogram(r, "asympo_rollout_episode_turns",
                         "Turns of the model in each episode the environment ended.",
                         {1, 2, 3, 4, 6, 8, 12, 16, 32})),
      reset_seconds(AddHistogram(r, "asympo_rollout_environment_reset_seconds",
                                 "Time from a Reset call to its answer.",
                                 {0.0001, 0.001, 0.01, 0.1, 1, 10})),
      step_seconds(AddHistogram(r, "asympo_rollout_environment_step_seconds",
                                "Time from a Step call (a turn sent) to its answer.",
                                {0.0001, 0.001, 0.01, 0.1, 1, 10})),
      inserted_tokens(AddCounter(r, "asympo_rollout_inserted_tokens_total",
                                 "Tokens the environment inserted into responses (not counted "
                                 "in asympo_rollout_tokens_generated_total).")) {}

LocalEpisodeMetrics::LocalEpisodeMetrics() {
  const auto counter = [this](const std::string& name) {
    return &AddCounter(registry_, "asympo_local_" + name, name);
  };
  GenerationCounters c{counter("tokens"),
                       counter("responses"),
                       counter("reward_sum"),
                       counter("correct"),
                       counter("groups"),
                       &prometheus::BuildCounter()
                            .Name("asympo_local_groups_dropped")
                            .Help("groups dropped")
                            .Register(registry_)};
  metrics_ = std::make_unique<EpisodeMetrics>(registry_, c);
}

void EpisodeMetrics::Failed(const std::string& reason) {
  failed.Add({{"reason", reason}}).Increment();
}

}  // namespace asympo::rollout
