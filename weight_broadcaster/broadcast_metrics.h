// Prometheus metrics of the weight broadcaster: the sender's (learner side,
// asympo_broadcast_*) and the receiver's (rollout side,
// asympo_rollout_weight_*). Names are a contract (docs/metrics.md).
//
// Families are built once, in the constructors, on a registry the caller
// owns; the returned metric objects are thread-safe.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace asympo::broadcast {

// The sender's (the store's own, version, snapshot bytes and publish
// seconds, are in snapshot_store.cc).
struct SenderMetrics {
  explicit SenderMetrics(prometheus::Registry& r);

  prometheus::Counter& bytes;         // bytes sent in chunks
  prometheus::Counter& failures;      // failed fetches + errors reported by receivers
  prometheus::Gauge& receivers;       // subscribed receivers
  prometheus::Gauge& versions_in_use;
  prometheus::Gauge& oldest_version;
  prometheus::Histogram& transfer_seconds;  // each completed FetchSnapshot stream
};

struct ReceiverMetrics {
  explicit ReceiverMetrics(prometheus::Registry& r);

  prometheus::Gauge& version;            // what the daemon samples with (ReportLoaded)
  prometheus::Gauge& connected;          // 1 while registered and subscribed
  prometheus::Counter& fetch_bytes;      // bytes received in chunks
  prometheus::Counter& failures;         // failed transfers
  prometheus::Histogram& fetch_seconds;  // each verified fetch, manifest to last CRC
};

}  // namespace asympo::broadcast
