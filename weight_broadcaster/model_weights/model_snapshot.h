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
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast {

// Names, dtypes and shapes of the model's parameters, in the model's order;
// every dtype is `dtype` where that is given (the dtype rollouts sample with,
// which may differ from the learner's float32 master weights).
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
//     into one flat host buffer (pinned when the model is on a GPU), which
//     the returned views point into until the next CopyToHost. On a GPU the
//     copy runs on a stream of its own, after an event recorded by Stage:
//     it overlaps the next step's kernels instead of queueing among them.
// Stage and CopyToHost must not overlap (the caller serializes them);
// several Stage calls may precede a CopyToHost (the last wins).
class SnapshotStaging {
 public:
  // Allocates both buffers. With `buckets`, the flat buffers are laid out
  // as the manifest PlanSnapshot makes with those packing options (the
  // buckets one after the other, each 64-byte aligned), so that
  // DeviceBucketsOfStage can hand the device copy to the NCCL transport.
  // A LibTorch error (out of memory, no pinned memory) is a status.
  static absl::StatusOr<std::unique_ptr<SnapshotStaging>> Create(
      const PolicyModel& model, at::ScalarType dtype, const PackingOptions* buckets = nullptr);

  absl::Status Stage(const PolicyModel& model);
  absl::StatusOr<std::vector<TensorView>> CopyToHost();

  // The last staged copy's buckets in device memory, valid while the
  // result's keep_alive lives (Stage then stages into another buffer).
  // Empty without the bucket layout. Call after CopyToHost: the staged
  // bytes are complete then.
  DeviceBuckets DeviceBucketsOfStage() const;

  int64_t bytes() const { return bytes_; }
  bool pinned() const { return host_.is_pinned(); }

 private:
  SnapshotStaging() = default;
  absl::Status Layout(const PolicyModel& model, at::ScalarType dtype, const PackingOptions* buckets,
                      int64_t* elements);

  std::vector<TensorSpec> specs_;
  std::vector<int64_t> offsets_;        // elements into the flat buffers
  std::vector<int64_t> bucket_starts_;  // bytes; empty without the bucket layout
  // Flat, on the model's device (host memory on a CPU). A buffer that a
  // snapshot still holds (DeviceBucketsOfStage) is not staged into again.
  std::shared_ptr<at::Tensor> device_;
  std::vector<std::shared_ptr<at::Tensor>> device_pool_;
  at::Tensor host_;  // flat, host
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
