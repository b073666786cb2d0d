// The rollout daemon's Prometheus metrics (docs/metrics.md lists every name;
// they are a contract for dashboards and alerts): what generation produced
// (RolloutMetrics) and what submission did with it (SubmitMetrics).
//
// Families are built once, in the constructors, on a registry the caller
// owns (main); the metric objects are thread-safe.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace asympo::rollout {

struct RolloutMetrics {
  explicit RolloutMetrics(prometheus::Registry& r);

  prometheus::Counter& tokens;            // response tokens sampled
  prometheus::Counter& groups_generated;  // groups sampled and scored
  prometheus::Counter& responses;
  prometheus::Counter& correct;  // exact matches by the task's verifier
  prometheus::Counter& reward_sum;
  prometheus::Histogram& generation_seconds;
  prometheus::Counter& flips;  // snapshots loaded into the spare model
  prometheus::Gauge& blocked;  // 1 while generation waits for buffer room
  prometheus::Counter& blocked_seconds;
};

struct SubmitMetrics {
  explicit SubmitMetrics(prometheus::Registry& r);

  prometheus::Counter& groups_sent;  // accepted by the learner
  prometheus::Family<prometheus::Counter>& dropped;
  prometheus::Counter& dropped_rejected;
  prometheus::Counter& dropped_stale;  // refused for their policy version (FAILED_PRECONDITION)
  prometheus::Counter& dropped_shutdown;
  prometheus::Counter& dropped_rewound;  // in the engine when the version went back
  prometheus::Family<prometheus::Counter>& submit_errors;  // by gRPC code name
  prometheus::Gauge& buffer_groups;
  prometheus::Gauge& buffer_capacity;
  prometheus::Gauge& connected;
};

}  // namespace asympo::rollout
