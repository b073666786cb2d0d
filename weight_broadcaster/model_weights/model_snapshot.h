// The bridge between a PolicyModel and the torch-free weight broadcaster:
// the tensor specs and byte views a learner publishes, and loading a received
// snapshot into a rollout daemon's model.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast {

// Names, dtypes and shapes of the model's parameters, in the model's order.
std::vector<TensorSpec> ModelTensorSpecs(const PolicyModel& model);

// ModelSignature(ModelTensorSpecs(model)).
std::string ModelSignatureOf(const PolicyModel& model);

// Host byte views of every parameter, for BroadcastSender::Publish. Tensors
// that are not contiguous CPU tensors are copied into `staging`, which must
// outlive the views. A LibTorch error (e.g. out of memory) is a status.
absl::StatusOr<std::vector<TensorView>> ModelTensorViews(const PolicyModel& model,
                                                         std::vector<at::Tensor>* staging);

// Copies a verified snapshot into `model`'s parameters. INVALID_ARGUMENT
// naming the tensor when the snapshot does not match the model (names,
// dtypes, shapes); on error (LibTorch's too) the model is unchanged.
absl::Status LoadSnapshotIntoModel(const ReceivedSnapshot& snapshot, PolicyModel* model);

}  // namespace asympo::broadcast
