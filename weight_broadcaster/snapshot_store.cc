#include "weight_broadcaster/snapshot_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/daemon/metric_builders.h"
#include "common/status_macros.h"

namespace asympo::broadcast {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The hardware's threads, at most `most`.
int Threads(int most) {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, std::max(1, most));
}

// INVALID_ARGUMENT unless every view has the bytes its entry in `m` needs.
absl::Status CheckViews(const v1::SnapshotManifest& m, const std::vector<TensorView>& tensors) {
  for (int i = 0; i < m.tensors_size(); ++i) {
    const TensorView& t = tensors[static_cast<size_t>(i)];
    if (t.size_bytes != m.tensors(i).size_bytes() || (t.size_bytes > 0 && t.data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.spec.name, "\" has ", t.size_bytes, " bytes",
                       t.data == nullptr ? " (null data)" : "", "; its shape and dtype need ",
                       m.tensors(i).size_bytes()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

SnapshotStore::SnapshotStore(SnapshotStoreOptions options, std::string model_signature,
                             prometheus::Registry& registry)
    : options_(std::move(options)),
      model_signature_(std::move(model_signature)),
      version_gauge_(metrics::AddGauge(registry, "asympo_broadcast_version",
                                       "Newest published snapshot version.")),
      bytes_gauge_(metrics::AddGauge(registry, "asympo_broadcast_snapshot_bytes",
                                     "Packed size of the newest snapshot (sum of its buckets).")),
      publish_seconds_(metrics::AddHistogram(
          registry, "asympo_broadcast_publish_seconds",
          "Time Publish takes to checksum a snapshot (and pack it, when given loose tensors).",
          {0.001, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300})),
      delta_bytes_gauge_(metrics::AddGauge(
          registry, "asympo_broadcast_delta_bytes",
          "What a receiver holding the version before fetches of the newest snapshot: its "
          "delta and the buckets that travel whole (0 for a keyframe: the whole snapshot).")),
      published_weights_(registry, "asympo_broadcast_published_weights",
                         "1, labelled with the version and the digest of the newest published "
                         "snapshot (compare a rollout's asympo_rollout_weights_info)."),
      incarnation_(options_.incarnation) {}

SnapshotStore::~SnapshotStore() {
  absl::MutexLock lock(&publish_mu_);
  CHECK(readers_.empty()) << readers_.size()
                          << " readers (transports) outlive the snapshot store they read";
}

void SnapshotStore::SetIncarnation(std::string incarnation, uint64_t resumed_from_version) {
  absl::MutexLock lock(&mu_);
  incarnation_ = std::move(incarnation);
  resumed_from_version_ = resumed_from_version;
}

std::string SnapshotStore::incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

std::shared_ptr<const Snapshot> SnapshotStore::latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

uint64_t SnapshotStore::latest_version() const {
  absl::MutexLock lock(&mu_);
  return latest_ == nullptr ? 0 : latest_->version();
}

absl::StatusOr<std::shared_ptr<const SnapshotPlan>> SnapshotStore::Plan(
    const std::vector<TensorSpec>& specs) {
  const std::string signature = ModelSignature(specs);
  if (signature != model_signature_) {
    return absl::InvalidArgumentError(absl::StrCat("the tensors' model signature ", signature,
                                                   " differs from the store's ", model_signature_));
  }
  absl::MutexLock lock(&plan_mu_);
  if (plan_ == nullptr) {
    ASYMPO_ASSIGN_OR_RETURN(plan_, SnapshotPlan::Make(specs, options_.packing));
  }
  return plan_;
}

absl::Status SnapshotStore::Publish(uint64_t version, const std::vector<TensorView>& tensors) {
  const double started = Now();
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorView& t : tensors) specs.push_back(t.spec);
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<const SnapshotPlan> plan, Plan(specs));
  ASYMPO_RETURN_IF_ERROR(CheckViews(plan->manifest(), tensors));
  absl::MutexLock publish_lock(&publish_mu_);
  // New buffers are zeroed; every one has the plan's layout, so the gaps
  // between tensors stay zero.
  const uint64_t bytes = std::max<uint64_t>(plan->flat_bytes(), 1);
  std::shared_ptr<char> buffer = ReuseOrMake(tensor_buffers_, [bytes] {
    return std::shared_ptr<char>(new char[bytes](), std::default_delete<char[]>());
  });
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].size_bytes == 0) continue;
    std::memcpy(buffer.get() + plan->tensor_start(static_cast<int>(i)), tensors[i].data,
                tensors[i].size_bytes);
  }
  HostBuckets host;
  host.plan = std::move(plan);
  host.data = buffer.get();
  host.keep_alive = std::move(buffer);
  return Adopt(version, std::move(host), nullptr, started);
}

absl::Status SnapshotStore::Publish(uint64_t version, HostBuckets host,
                                    const DeviceBuckets* device) {
  const double started = Now();
  absl::MutexLock publish_lock(&publish_mu_);
  {
    absl::MutexLock lock(&plan_mu_);
    if (host.plan == nullptr || host.plan != plan_ || host.data == nullptr) {
      return absl::InvalidArgumentError(
          "the host buckets are not laid out by this store's plan (SnapshotStore::Plan)");
    }
  }
  return Adopt(version, std::move(host), device, started);
}

// Checks the version, stamps `host` (CRCs, incarnation) and makes it the
// latest snapshot, then hands it to every reader.
absl::Status SnapshotStore::Adopt(uint64_t version, HostBuckets host, const DeviceBuckets* device,
                                  double started) {
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->host = std::move(host);
  if (device != nullptr) snapshot->device = *device;
  v1::SnapshotManifest m = snapshot->host.plan->manifest();
  m.set_version(version);
  std::shared_ptr<const Snapshot> base;
  {
    absl::MutexLock lock(&mu_);
    base = latest_;
    if (latest_ != nullptr && version <= latest_->version()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "version ", version, " is not greater than the latest published, ", latest_->version()));
    }
    m.set_incarnation(incarnation_);
    m.set_resumed_from_version(resumed_from_version_);
  }
  // The buckets' CRCs over several threads (a bucket in 32 MiB pieces), or
  // taken with the delta, in the same pass.
  std::vector<uint32_t> crcs;
  snapshot->delta = DeltaOf(base, *snapshot, &m, &crcs);
  base.reset();
  if (crcs.empty()) {
    std::vector<Crc32cSpan> spans;
    for (int b = 0; b < m.buckets_size(); ++b) {
      spans.push_back({snapshot->bucket(b), static_cast<size_t>(m.buckets(b).size_bytes())});
    }
    crcs = Crc32cOfMany(spans, Threads(8));
  }
  for (int b = 0; b < m.buckets_size(); ++b) m.mutable_buckets(b)->set_crc32c(crcs[b]);
  ++publishes_;
  auto announcement = std::make_shared<v1::SnapshotAnnouncement>();
  *announcement->mutable_manifest() = std::move(m);
  snapshot->announcement = std::move(announcement);
  std::shared_ptr<const Snapshot> adopted = std::move(snapshot);
  {
    absl::MutexLock lock(&mu_);
    latest_ = adopted;
  }
  for (auto& [id, reader] : readers_) reader(adopted);
  const v1::SnapshotManifest& manifest = adopted->manifest();
  publish_seconds_.Observe(Now() - started);
  version_gauge_.Set(static_cast<double>(version));
  bytes_gauge_.Set(static_cast<double>(manifest.total_bytes()));
  delta_bytes_gauge_.Set(adopted->delta == nullptr ? 0.0
                                                   : static_cast<double>(adopted->delta->bytes));
  const std::string digest = WeightDigest(manifest);
  published_weights_.Set(WeightsLabels(version, digest));
  VLOG(1) << "published version " << version << " (digest " << digest
          << "): " << manifest.total_bytes() << " bytes in " << manifest.buckets_size()
          << " buckets";
  return absl::OkStatus();
}

std::shared_ptr<const SnapshotDelta> SnapshotStore::DeltaOf(
    const std::shared_ptr<const Snapshot>& base, const Snapshot& next, v1::SnapshotManifest* m,
    std::vector<uint32_t>* crcs) {
  const int every = options_.delta_keyframe_every;
  if (every <= 0 || publishes_ % static_cast<uint64_t>(every) == 0 || base == nullptr ||
      base->host.plan != next.host.plan || base->manifest().incarnation() != m->incarnation()) {
    return nullptr;
  }
  std::vector<const char*> from, to;
  for (int b = 0; b < m->buckets_size(); ++b) {
    from.push_back(base->bucket(b));
    to.push_back(next.bucket(b));
  }
  absl::StatusOr<std::shared_ptr<const SnapshotDelta>> delta =
      EncodeSnapshotDelta(*m, from, to, base->version(), Threads(options_.delta_threads), crcs);
  if (!delta.ok()) {
    // The layout is the store's own: not expected; the version goes whole.
    LOG(WARNING) << "no delta for version " << m->version() << ": " << delta.status();
    crcs->clear();
    return nullptr;
  }
  if (absl::c_all_of((*delta)->buckets, [](const std::string& d) { return d.empty(); })) {
    return nullptr;  // every bucket travels whole (its CRCs are taken)
  }
  m->set_has_delta_base(true);
  m->set_delta_base_version(base->version());
  return *std::move(delta);
}

int SnapshotStore::AddReader(Reader reader) {
  absl::MutexLock publish_lock(&publish_mu_);
  const int id = next_reader_++;
  std::shared_ptr<const Snapshot> current = latest();
  if (current != nullptr) reader(current);
  readers_.emplace(id, std::move(reader));
  return id;
}

void SnapshotStore::RemoveReader(int id) {
  absl::MutexLock publish_lock(&publish_mu_);
  readers_.erase(id);
}

}  // namespace asympo::broadcast
