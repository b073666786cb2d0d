// The bridge between a PolicyModel and the torch-free weight broadcaster:
// the tensor specs and byte views a learner publishes, and loading a received
// snapshot into a rollout daemon's model.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/snapshot_manifest.h"
#include "weight_broadcaster/snapshot_store.h"

namespace asympo::broadcast {

// Names, dtypes and shapes of the model's parameters, in the model's order;
// every dtype is `dtype` where that is given (the dtype rollouts sample with,
// which may differ from the learner's float32 master weights), else the
// model's ModelOptions::dtype (its adapters, float32 whatever the model's
// dtype, travel in that dtype too).
std::vector<TensorSpec> ModelTensorSpecs(const PolicyModel& model,
                                         at::ScalarType dtype = at::ScalarType::Undefined);

// ModelSignature(ModelTensorSpecs(model, dtype)).
std::string ModelSignatureOf(const PolicyModel& model,
                             at::ScalarType dtype = at::ScalarType::Undefined);

// A consistent copy of a model's parameters in one dtype, on its way from
// the model's device to host memory for the broadcaster, in two stages so
// that the trainer only pays for a copy on its own device:
//   Stage(): on the trainer thread, between optimizer steps: every parameter
//     converted into one flat buffer on the model's device (on a GPU only
//     kernels are enqueued, on the trainer's stream, ordered before the next
//     step's updates);
//   CopyToHost(): on any other thread: that buffer copied, in one transfer,
//     into one flat host buffer (pinned when the model is on a GPU). On a
//     GPU the copy runs on a stream of its own, after an event recorded by
//     Stage: it overlaps the next step's kernels instead of queueing among
//     them.
// Both buffers are laid out as the store's plan says (SnapshotPlan: the
// snapshot's buckets one after the other, the gaps zero), so that the host
// copy is the snapshot's buckets as they are (HostBucketsOfCopy, adopted by
// SnapshotStore::Publish without another copy) and the device copy can be
// broadcast over NCCL in place (DeviceBucketsOfStage). A buffer a snapshot
// still holds is not written again: the next Stage or CopyToHost takes
// another one (one spare each is kept).
// Stage and CopyToHost must not overlap (the caller serializes them);
// several Stage calls may precede a CopyToHost (the last wins).
class SnapshotStaging {
 public:
  // Laid out as `store`'s plan (SnapshotStore::Plan of
  // ModelTensorSpecs(model, dtype)). With `device_buckets`,
  // DeviceBucketsOfStage hands the device copy to the NCCL transport.
  // Allocates the buffers; a LibTorch error (out of memory, no pinned
  // memory) is a status, as is a dtype that cannot be broadcast.
  // `host_only`: no device buffer; the weights are staged straight into
  // (pinned) host memory, a tensor at a time (for a device with little
  // memory to spare; not with `device_buckets`).
  static absl::StatusOr<std::unique_ptr<SnapshotStaging>> Create(const PolicyModel& model,
                                                                 at::ScalarType dtype,
                                                                 SnapshotStore& store,
                                                                 bool device_buckets,
                                                                 bool host_only = false);
  // With a plan of its own (SnapshotPlan::Make with `buckets`, else the
  // default packing), for copies no store adopts as they are; with
  // `buckets` there are device buckets too.
  static absl::StatusOr<std::unique_ptr<SnapshotStaging>> Create(
      const PolicyModel& model, at::ScalarType dtype, const PackingOptions* buckets = nullptr);

  // Copies every parameter into the staging buffer (converted to the
  // dtype): BeginStage, StageParameters of all, FinishStage.
  absl::Status Stage(const PolicyModel& model);
  // The same in parts, for weights readable a unit at a time (a fully
  // sharded learner gathers one unit, stages it, frees it): the
  // parameters `indices` (positions in model.named_parameters()) must be
  // readable in `model` for the call.
  absl::Status BeginStage();
  absl::Status StageParameters(const PolicyModel& model, const std::vector<size_t>& indices);
  absl::Status FinishStage();
  // The returned views point into the host copy until the next CopyToHost.
  absl::StatusOr<std::vector<TensorView>> CopyToHost();

  // The last CopyToHost's buffer as the plan's host buckets, for
  // SnapshotStore::Publish; its keep_alive holds the buffer.
  HostBuckets HostBucketsOfCopy() const;
  // The last staged copy's buckets in device memory, valid while the
  // result's keep_alive lives. Empty (null data) without device buckets.
  // Call after CopyToHost: the staged bytes are complete then.
  DeviceBuckets DeviceBucketsOfStage() const;

  const SnapshotPlan& plan() const { return *plan_; }
  int64_t bytes() const { return bytes_; }
  bool pinned() const { return host_->is_pinned(); }
  bool host_only() const { return host_only_; }

 private:
  SnapshotStaging() = default;
  static absl::StatusOr<std::unique_ptr<SnapshotStaging>> Allocate(
      const PolicyModel& model, at::ScalarType dtype, std::shared_ptr<const SnapshotPlan> plan,
      bool device_buckets, bool host_only);
  at::Tensor NewHostBuffer() const;

  std::shared_ptr<const SnapshotPlan> plan_;
  std::vector<TensorSpec> specs_;
  std::vector<int64_t> offsets_;  // elements into the flat buffers
  bool device_buckets_ = false;
  bool host_only_ = false;  // no device buffer: staged into host_
  int64_t elements_ = 1;    // of the flat buffers
  at::ScalarType dtype_ = at::kFloat;
  bool pinned_ = false;
  // Flat, on the model's device (host memory on a CPU; none when
  // host_only_), and on the host; each the current one of its pool.
  std::shared_ptr<at::Tensor> device_;
  std::vector<std::shared_ptr<at::Tensor>> device_pool_;
  std::shared_ptr<at::Tensor> host_;
  std::vector<std::shared_ptr<at::Tensor>> host_pool_;
  int64_t bytes_ = 0;
  // GPU only: recorded on the trainer's stream after Stage's copies, and
  // the stream CopyToHost copies on.
  std::unique_ptr<c10::Event> staged_;
  std::optional<c10::Stream> copy_stream_;
};

// Copies a verified snapshot into `model`'s parameters. INVALID_ARGUMENT
// naming the tensor when the snapshot does not match the model (names,
// dtypes, shapes); on error (LibTorch's too) the model is unchanged.
absl::Status LoadSnapshotIntoModel(const ReceivedSnapshot& snapshot, PolicyModel* model);

}  // namespace asympo::broadcast
