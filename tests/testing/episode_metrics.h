// Test helper: an EpisodeMetrics whose generation counters (the daemon's,
// registered under short names) live in the test's registry.
#pragma once

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "rollout_server/episodes/episode_metrics.h"

namespace asympo::testing {

inline std::unique_ptr<rollout::EpisodeMetrics> TestEpisodeMetrics(prometheus::Registry& registry) {
  auto counter = [&](const std::string& name) {
    return &prometheus::BuildCounter().Name(name).Help(name).Register(registry).Add({});
  };
  auto& dropped = prometheus::BuildCounter().Name("dropped").Help("d").Register(registry);
  rollout::GenerationCounters c{counter("t"), counter("r"), counter("s"),
                                counter("c"), counter("g"), &dropped};
  return std::make_unique<rollout::EpisodeMetrics>(registry, c);
}

}  // namespace asympo::testing
