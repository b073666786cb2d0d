// The learner's side of the weight broadcast: each version the trainer
// publishes (TrainerOptions::publish_every, --broadcast_every) goes to the
// snapshot store (weight_broadcaster/snapshot_store.h), which every
// transport reads, in the dtype rollouts sample with (--dtype), off
// the trainer thread.
//
// Publish(), on the trainer thread after an optimizer step, only stages the
// weights on the model's device (SnapshotStaging: one conversion copy,
// enqueued kernels on a GPU; fully sharded, a unit at a time as each is
// gathered, so that no whole-model gather is needed) and returns. With
// --snapshot_staging=host there is no device buffer: the weights are staged
// straight into pinned host memory. A publisher thread then copies the
// staged buffer to (pinned) host memory in one transfer, laid out as the
// store's buckets (SnapshotStore::Plan), and the store adopts that
// memory, checksums it and announces it. The trainer waits only if it
// finishes a step while that copy of the previous version is still in
// flight. When the publisher thread falls behind (a slow CRC or a huge
// model), a staged version that was not picked up yet is replaced by the
// newer one and counted in asympo_learner_snapshots_coalesced_total:
// receivers only ever want the newest weights. With the NCCL transport and
// the model on a GPU, NCCL broadcasts from the staged device copy (laid out
// the same way), with no host round trip
// (SnapshotStaging::DeviceBucketsOfStage).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <thread>

#include <prometheus/counter.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "learner_server/trainer/trainer.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"
#include "weight_broadcaster/snapshot_store.h"

namespace asympo::learner {

class SnapshotPublisher : public WeightPublisher {
 public:
  // `store` must outlive the publisher, and `coalesced` too (counts the
  // versions replaced before they were picked up; learner_metrics.h
  // registers it: RegisterSnapshotCounters). The staging
  // buffers (two snapshots' worth in `dtype`: one on the model's device, one
  // on the host) are allocated here.
  // `host_only`: no device staging buffer; each version is staged straight
  // into pinned host memory (--snapshot_staging=host).
  static absl::StatusOr<std::unique_ptr<SnapshotPublisher>> Create(
      broadcast::SnapshotStore* store, const PolicyModel& model, at::ScalarType dtype,
      prometheus::Counter& coalesced, bool device_buckets = false, bool host_only = false);
  // Publishes what is staged, then stops the thread.
  ~SnapshotPublisher() override;

  // WeightPublisher: stages the version for the publisher thread, part by
  // part as `parts` makes them readable (the parts of other ranks it runs
  // through with nothing to stage). A failed stage is
  // logged and the version left out; only `parts`' failure is returned.
  absl::Status Publish(uint64_t version, const PolicyModel& model,
                       const WeightParts& parts) override;
  using WeightPublisher::Publish;

  // Stages, copies and publishes `version` on the calling thread, after
  // whatever is in flight (the daemon's first version, at start).
  absl::Status PublishNow(uint64_t version, const PolicyModel& model, const WeightParts& parts);
  absl::Status PublishNow(uint64_t version, const PolicyModel& model);

  // Waits until everything staged so far has been published (tests).
  void Flush();

  int64_t coalesced() const;

 private:
  SnapshotPublisher(broadcast::SnapshotStore* store,
                    std::unique_ptr<broadcast::SnapshotStaging> staging,
                    prometheus::Counter& coalesced);
  // With mu_ held: stages what `parts` makes readable; `parts`' own
  // failure is returned, the staging's goes to `staged`.
  absl::Status StageLocked(const PolicyModel& model, const WeightParts& parts, absl::Status* staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With mu_ held: waits until nothing is staged, copied or being sent.
  void AwaitIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  // Copies the staged version to the host and gives it to the store.
  absl::Status CopyAndSend(uint64_t version);

  broadcast::SnapshotStore* const store_;
  const std::unique_ptr<broadcast::SnapshotStaging> staging_;
  prometheus::Counter& coalesced_counter_;

  mutable absl::Mutex mu_;
  std::optional<uint64_t> staged_ ABSL_GUARDED_BY(mu_);  // waiting for the thread
  bool copying_ ABSL_GUARDED_BY(mu_) = false;            // staging buffer being read
  bool sending_ ABSL_GUARDED_BY(mu_) = false;            // host buffer being read
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t coalesced_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace asympo::learner
