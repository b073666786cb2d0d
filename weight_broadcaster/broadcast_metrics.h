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

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "asympo/v1/weight_broadcast.pb.h"

namespace asympo::broadcast {

// A gauge family with one series at a time, of value 1, whose labels say
// what is current (Prometheus's info pattern): Set replaces the series.
// Thread-safe.
class InfoGauge {
 public:
  InfoGauge(prometheus::Registry& r, const std::string& name, const std::string& help);
  void Set(const std::map<std::string, std::string>& labels) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Family<prometheus::Gauge>& family_;
  absl::Mutex mu_;
  prometheus::Gauge* current_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// The weights' digest: 16 hex digits of the SHA-256 of the model signature
// and every bucket's index, size and CRC-32C, in order. Equal for equal
// bytes (whatever the version number or incarnation), so the learner's
// published digest and a rollout's loaded one can be compared from outside
// (asympo_broadcast_published_weights / asympo_rollout_weights_info).
std::string WeightDigest(const v1::SnapshotManifest& manifest);

// The weights a version holds: {version, digest} (WeightDigest).
std::map<std::string, std::string> WeightsLabels(uint64_t version, const std::string& digest);

// The sender's (the store's own, version, snapshot bytes and publish
// seconds, are in snapshot_store.cc).
struct SenderMetrics {
  explicit SenderMetrics(prometheus::Registry& r);

  prometheus::Counter& bytes;     // bytes sent in chunks
  prometheus::Counter& failures;  // failed fetches + errors reported by receivers
  prometheus::Gauge& receivers;   // subscribed receivers
  prometheus::Gauge& versions_in_use;
  prometheus::Gauge& oldest_version;
  prometheus::Histogram& transfer_seconds;   // each completed FetchSnapshot stream
  prometheus::Counter& nccl_bytes;           // broadcast by rank 0, buckets and deltas
  prometheus::Counter& nccl_delta_versions;  // versions broadcast as deltas
};

struct ReceiverMetrics {
  explicit ReceiverMetrics(prometheus::Registry& r);

  prometheus::Gauge& version;            // what the daemon samples with (ReportLoaded)
  prometheus::Gauge& connected;          // 1 while registered and subscribed
  prometheus::Counter& fetch_bytes;      // bytes received in chunks
  prometheus::Counter& failures;         // failed transfers
  prometheus::Counter& delta_versions;   // versions rebuilt from a delta
  prometheus::Counter& delta_fallbacks;  // deltas that failed, fetched whole instead
  prometheus::Histogram& fetch_seconds;  // each verified fetch, manifest to last CRC
  prometheus::Histogram& load_seconds;   // each snapshot's copy into the model
  // asympo_rollout_weights_info{version, digest}: what the daemon samples
  // with (ReportLoaded), to compare with the learner's published digest.
  InfoGauge weights;
};

}  // namespace asympo::broadcast
