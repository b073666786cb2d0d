// The rollout daemon's metrics of multi-turn episodes (docs/metrics.md).
#pragma once

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace asympo::rollout {

// The daemon's counters that episodes add to as single-turn generation
// does (rollout_metrics.h); they must outlive the EpisodeMetrics.
struct GenerationCounters {
  prometheus::Counter* tokens = nullptr;  // generated tokens
  prometheus::Counter* responses = nullptr;
  prometheus::Counter* reward_sum = nullptr;
  prometheus::Counter* correct = nullptr;
  prometheus::Counter* groups = nullptr;
  prometheus::Family<prometheus::Counter>* dropped = nullptr;  // by reason
};

struct EpisodeMetrics {
  EpisodeMetrics(prometheus::Registry& r, GenerationCounters generation);

  // An episode failed for `reason` (deadline, unavailable, error,
  // invalid_answer, overlong, not_done).
  void Failed(const std::string& reason);

  GenerationCounters generation;
  prometheus::Counter& episodes;  // ended by the environment (done)
  prometheus::Family<prometheus::Counter>& failed;
  prometheus::Counter& dropped;  // groups_dropped_total{reason="environment"}
  prometheus::Histogram& turns;  // per episode that ended done
  prometheus::Histogram& reset_seconds;
  prometheus::Histogram& step_seconds;
  prometheus::Counter& inserted_tokens;
};

// Episode metrics on a registry of their own that nobody exports, with
// counters of their own for GenerationCounters: for episodes run in
// process (evaluations, benchmarks).
class LocalEpisodeMetrics {
 public:
  LocalEpisodeMetrics();
  EpisodeMetrics* get() { return metrics_.get(); }

 private:
  prometheus::Registry registry_;
  std::unique_ptr<EpisodeMetrics> metrics_;
};

}  // namespace asympo::rollout
