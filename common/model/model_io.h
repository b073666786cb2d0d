// Loading and exporting the policy as a Hugging Face model directory:
// config.json plus model.safetensors, or shards with
// model.safetensors.index.json. Functions are thread-compatible.
#pragma once

#include <functional>
#include <vector>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/policy_model.h"

namespace asympo {

// Reads `dir`/config.json and the checkpoint beside it. Every parameter must
// be present with its exact shape; missing, extra or mis-shaped tensors are
// INVALID_ARGUMENT naming them, like a bad config key or a corrupt file.
// Weights are converted to options.dtype.
absl::StatusOr<std::unique_ptr<PolicyModel>> LoadPolicyModel(const std::string& dir,
                                                             const ModelOptions& options);

// What the daemons' --model flag names: "tiny" builds the built-in tiny
// model (ModelConfig::Tiny(tiny_vocab_size), random weights from
// options.seed); anything else is a Hugging Face directory for
// LoadPolicyModel.
absl::StatusOr<std::unique_ptr<PolicyModel>> CreateOrLoadPolicyModel(const std::string& model,
                                                                     int64_t tiny_vocab_size,
                                                                     const ModelOptions& options);

// The same, with the weights readable a part at a time (a fully sharded
// learner gathers one unit at a time): `parts` calls its argument with the
// positions (in model.named_parameters()) of each part's parameters while
// they are readable in `model`. Each part is written as its own shard
// (model-0000i-of-0000n.safetensors, with the index), converted on its own:
// the process never holds the whole model. `parts` runs to its end (it may
// be a collective); its failure or the first write's is returned.
using ModelPartVisitor = std::function<absl::Status(const std::vector<size_t>&)>;
absl::Status ExportPolicyModelInParts(
    const PolicyModel& model, const std::string& dir, at::ScalarType dtype,
    const std::function<absl::Status(const ModelPartVisitor&)>& parts);

// Parses a --dtype flag value: "float32" or "bfloat16". INVALID_ARGUMENT
// naming the value otherwise.
absl::StatusOr<at::ScalarType> ParseModelDType(const std::string& dtype);

// Writes config.json and the weights to `dir`, creating it; shards above
// `max_shard_bytes`. The weights are in `dtype` (undefined: the model's),
// on the host whatever the model's device, converted a shard at a time
// (the export holds one shard's host copy, not the whole model's). The
// result loads with LoadPolicyModel (on any device) and with Hugging Face
// transformers.
absl::Status ExportPolicyModel(const PolicyModel& model, const std::string& dir,
                               int64_t max_shard_bytes = int64_t{5} << 30,
                               at::ScalarType dtype = at::ScalarType::Undefined);

}  // namespace asympo
