#include "weight_broadcaster/broadcast_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/daemon/metric_builders.h"
#include "common/security/x509.h"

namespace asympo::broadcast {
namespace {

using metrics::AddCounter;
using metrics::AddGauge;

prometheus::Histogram& AddSecondsHistogram(prometheus::Registry& r, const std::string& name,
                                           const std::string& help) {
  return metrics::AddHistogram(r, name, help,
                               {0.001, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300});
}

}  // namespace

SenderMetrics::SenderMetrics(prometheus::Registry& r)
    : bytes(AddCounter(r, "asympo_broadcast_bytes_total",
                       "Snapshot bytes sent in FetchSnapshot chunks.")),
      failures(
          AddCounter(r, "asympo_broadcast_failures_total",
                     "Fetches that ended with an error or a cancel, plus transfer and load errors "
                     "reported by receivers.")),
      receivers(AddGauge(r, "asympo_broadcast_receivers",
                         "Registered receivers with an open Subscribe stream.")),
      versions_in_use(
          AddGauge(r, "asympo_broadcast_versions_in_use",
                   "Distinct versions that subscribed receivers report sampling with.")),
      oldest_version(AddGauge(r, "asympo_broadcast_oldest_receiver_version",
                              "Oldest version a subscribed receiver samples with (0 when none).")),
      transfer_seconds(
          AddSecondsHistogram(r, "asympo_broadcast_transfer_seconds",
                              "Duration of each FetchSnapshot stream that sent every chunk.")),
      nccl_bytes(AddCounter(r, "asympo_broadcast_nccl_bytes_total",
                            "Bytes rank 0 broadcast over the NCCL transport (buckets and "
                            "deltas).")),
      nccl_delta_versions(AddCounter(r, "asympo_broadcast_nccl_delta_versions_total",
                                     "Versions broadcast over NCCL as deltas against the "
                                     "version broadcast before.")) {}

InfoGauge::InfoGauge(prometheus::Registry& r, const std::string& name, const std::string& help)
    : family_(prometheus::BuildGauge().Name(name).Help(help).Register(r)) {}

void InfoGauge::Set(const std::map<std::string, std::string>& labels) {
  absl::MutexLock lock(&mu_);
  if (current_ != nullptr) family_.Remove(current_);
  current_ = &family_.Add(labels);
  current_->Set(1);
}

std::string WeightDigest(const v1::SnapshotManifest& manifest) {
  std::string text = manifest.model_signature();
  for (const v1::BucketInfo& b : manifest.buckets()) {
    absl::StrAppend(&text, "\n", b.index(), ":", b.size_bytes(), ":", b.crc32c());
  }
  return security::Sha256Hex(text).substr(0, 16);
}

std::map<std::string, std::string> WeightsLabels(uint64_t version, const std::string& digest) {
  return {{"version", std::to_string(version)}, {"digest", digest}};
}

ReceiverMetrics::ReceiverMetrics(prometheus::Registry& r)
    : version(AddGauge(r, "asympo_rollout_weight_version",
                       "Weight version the rollout daemon samples with (as it reported last).")),
      connected(AddGauge(r, "asympo_rollout_weight_connected",
                         "1 while registered with the learner's broadcaster and subscribed.")),
      fetch_bytes(AddCounter(r, "asympo_rollout_weight_fetch_bytes_total",
                             "Snapshot bytes received in FetchSnapshot chunks.")),
      failures(
          AddCounter(r, "asympo_rollout_weight_failures_total",
                     "Snapshot transfers that failed (network, timeout, checksum, bad manifest).")),
      delta_versions(AddCounter(r, "asympo_rollout_weight_delta_versions_total",
                                "Versions fetched as a delta against the version held, rebuilt "
                                "and verified.")),
      delta_fallbacks(AddCounter(
          r, "asympo_rollout_weight_delta_fallbacks_total",
          "Deltas that did not rebuild the version (a bucket's checksum failed, or the delta was "
          "malformed), after which the version was fetched whole.")),
      fetch_seconds(AddSecondsHistogram(
          r, "asympo_rollout_weight_fetch_seconds",
          "Duration of each verified snapshot fetch, first chunk request to last "
          "checksum.")),
      load_seconds(AddSecondsHistogram(
          r, "asympo_rollout_weight_load_seconds",
          "Duration of each verified snapshot's load into the rollout's model (its spare copy, "
          "or the one it samples with between batches).")),
      weights(r, "asympo_rollout_weights_info",
              "1, labelled with the version and the digest of the weights the rollout daemon "
              "samples with (compare asympo_broadcast_published_weights).") {}

}  // namespace asympo::broadcast
