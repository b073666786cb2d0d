// The snapshot store: the learner's latest published weights, which every
// transport reads (the gRPC fetch and the NCCL broadcast of BroadcastSender,
// and the weight group; docs/architecture.md, "Weights out").
//
// The store owns the snapshot's bucket layout: Plan() makes it once
// (SnapshotPlan, snapshot_plan.h), and the learner's staging writes its host
// copy already laid out as those buckets. Publish(version, host) adopts that
// memory as the snapshot's buckets (no copy), stamps each bucket's CRC-32C
// and the store's incarnation into its manifest, keeps it as the latest
// snapshot and hands it to every reader; Publish(version, tensors) first
// packs loose tensors into buckets of its own. Only the latest snapshot is
// held here: an older one lives on only while a reader (a fetch, a
// broadcast) still holds it.
//
// Readers: a transport registers a callback (AddReader) that is called with
// each newly published snapshot, on the publishing thread, after the store
// has made it the latest, one publish at a time, and at once with the
// latest if there is one. A callback must not block and must not call back
// into the store's Publish; it may read latest().
//
// Memory: the latest snapshot's buckets (host memory the publisher handed
// over) and its delta (at most half of them), plus any older snapshot a
// reader still holds; the publisher reuses
// a buffer once the store and every reader have let it go. Publish(version,
// tensors) keeps its own buffers the same way.
//
// Torch-free: tensors arrive as raw byte views. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/broadcast_metrics.h"
#include "weight_broadcaster/snapshot_delta.h"
#include "weight_broadcaster/snapshot_manifest.h"
#include "weight_broadcaster/snapshot_plan.h"

namespace asympo::broadcast {

// One tensor to publish: its spec and its bytes (size must equal
// product(shape) * DTypeSize(dtype)). The bytes are copied during Publish.
struct TensorView {
  TensorSpec spec;
  const void* data = nullptr;
  uint64_t size_bytes = 0;
};

// A snapshot's bytes in host memory laid out as `plan` says (the store's:
// SnapshotStore::Plan): plan->flat_bytes() bytes at `data`, bucket b at
// data + plan->bucket_start(b), the gaps inside buckets zero. Publish adopts
// them as the snapshot's buckets: `keep_alive` holds the memory until the
// store and every reader have let the snapshot go, and the bytes must not
// change meanwhile.
struct HostBuckets {
  std::shared_ptr<const SnapshotPlan> plan;
  char* data = nullptr;
  std::shared_ptr<void> keep_alive;
};

// The same bytes in GPU memory, laid out the same way, for the NCCL
// transport to broadcast straight from the device. `keep_alive` holds that
// memory until the store lets the snapshot go.
struct DeviceBuckets {
  const void* data = nullptr;  // on the NCCL device; null: none
  std::shared_ptr<const void> keep_alive;
};

// A published snapshot. The announcement (manifest only) is shared
// separately so that a slow subscriber never pins the bytes; the bytes (the
// adopted host buckets) live while the store holds the snapshot as its
// latest or a reader (a fetch, a chunk inside gRPC) still holds them.
struct Snapshot {
  std::shared_ptr<const v1::SnapshotAnnouncement> announcement;
  HostBuckets host;      // the bytes, laid out by host.plan
  DeviceBuckets device;  // the same bytes on the NCCL device, if given
  // The same version as a delta against manifest().delta_base_version()
  // (null for a keyframe: manifest().has_delta_base() is false).
  std::shared_ptr<const SnapshotDelta> delta;

  const v1::SnapshotManifest& manifest() const { return announcement->manifest(); }
  uint64_t version() const { return manifest().version(); }
  // Manifest bucket b's bytes in host memory, and on the device (null
  // without device buckets).
  char* bucket(int b) const { return host.data + host.plan->bucket_start(b); }
  const void* device_bucket(int b) const {
    return device.data == nullptr
               ? nullptr
               : static_cast<const char*>(device.data) + host.plan->bucket_start(b);
  }
};

struct SnapshotStoreOptions {
  PackingOptions packing;
  // The learner process's incarnation (LearnerStatus.incarnation) that
  // every manifest carries; SetIncarnation may replace it before the first
  // Publish.
  std::string incarnation;
  // Delta versions: every version but every delta_keyframe_every-th (and
  // the first) also holds its delta against the version published before
  // (Snapshot::delta), encoded when it is published on `delta_threads`
  // threads. 0: no deltas.
  int delta_keyframe_every = 0;
  int delta_threads = 8;
};

class SnapshotStore {
 public:
  // `model_signature` is ModelSignature() of the tensors every Publish will
  // carry. The store's metrics (asympo_broadcast_version, _snapshot_bytes,
  // _publish_seconds) are registered in `registry`, which must outlive it.
  SnapshotStore(SnapshotStoreOptions options, std::string model_signature,
                prometheus::Registry& registry);
  // Every reader must have gone (the transports remove theirs in their
  // destructors): the store outlives what reads it.
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // The bucket layout of every snapshot (SnapshotPlan::Make with the
  // options' packing), made on the first call and the same object
  // afterwards. INVALID_ARGUMENT when the specs' signature differs from
  // model_signature (or the plan refuses them).
  absl::StatusOr<std::shared_ptr<const SnapshotPlan>> Plan(const std::vector<TensorSpec>& specs);

  // Makes version `version` with `host` as its buckets (adopted, not
  // copied; their checksums are taken here) the latest snapshot and hands
  // it to every reader. INVALID_ARGUMENT when `host` is not laid out by this
  // store's Plan, or `version` is not greater than the latest published one
  // (the first Publish may use any version, e.g. the one restored from a
  // checkpoint). With `device` (non-null), the NCCL transport broadcasts
  // the buckets from there instead of from host memory.
  absl::Status Publish(uint64_t version, HostBuckets host, const DeviceBuckets* device = nullptr);
  // Copies `tensors` into buckets laid out by Plan, then publishes them as
  // above. INVALID_ARGUMENT also when the tensors' signature differs from
  // model_signature or a view's size is wrong.
  absl::Status Publish(uint64_t version, const std::vector<TensorView>& tensors);

  // The incarnation and the checkpoint version it resumed from that every
  // later manifest carries (SnapshotManifest.incarnation).
  void SetIncarnation(std::string incarnation, uint64_t resumed_from_version);
  std::string incarnation() const;

  // The latest snapshot (null before the first Publish), and its version.
  std::shared_ptr<const Snapshot> latest() const;
  uint64_t latest_version() const;
  const std::string& model_signature() const { return model_signature_; }

  // Registers `reader`, called with every snapshot published from now on
  // and, before AddReader returns, with the latest one if there is one.
  // RemoveReader(id) returns once no call of that reader is under way.
  using Reader = std::function<void(const std::shared_ptr<const Snapshot>&)>;
  int AddReader(Reader reader);
  void RemoveReader(int id);

 private:
  absl::Status Adopt(uint64_t version, HostBuckets host, const DeviceBuckets* device,
                     double started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(publish_mu_);
  // The delta of `next` (manifest `m`) against `base` when this publish
  // is not a keyframe, `base` is of the same layout and incarnation and
  // some bucket has a delta; null otherwise. `crcs`: `next`'s bucket CRCs
  // when the delta was encoded (taken in the same pass), else empty. Sets
  // m's delta base.
  std::shared_ptr<const SnapshotDelta> DeltaOf(const std::shared_ptr<const Snapshot>& base,
                                               const Snapshot& next, v1::SnapshotManifest* m,
                                               std::vector<uint32_t>* crcs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(publish_mu_);

  const SnapshotStoreOptions options_;
  const std::string model_signature_;
  prometheus::Gauge& version_gauge_;
  prometheus::Gauge& bytes_gauge_;
  prometheus::Histogram& publish_seconds_;
  prometheus::Gauge& delta_bytes_gauge_;
  InfoGauge published_weights_;  // asympo_broadcast_published_weights{version, digest}

  absl::Mutex plan_mu_;
  std::shared_ptr<const SnapshotPlan> plan_ ABSL_GUARDED_BY(plan_mu_);

  // Serializes publishes and the calls of the readers.
  absl::Mutex publish_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Publish(version, tensors)'s buffers, laid out by the plan: one is
  // reused once no snapshot holds it (it is then already faulted in).
  std::vector<std::shared_ptr<char>> tensor_buffers_ ABSL_GUARDED_BY(publish_mu_);
  absl::flat_hash_map<int, Reader> readers_ ABSL_GUARDED_BY(publish_mu_);
  uint64_t publishes_ ABSL_GUARDED_BY(publish_mu_) = 0;  // for delta_keyframe_every
  int next_reader_ ABSL_GUARDED_BY(publish_mu_) = 0;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  std::string incarnation_ ABSL_GUARDED_BY(mu_);
  uint64_t resumed_from_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace asympo::broadcast
