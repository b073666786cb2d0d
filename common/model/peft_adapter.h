// Low-rank adapters (common/model/lora.h) as a PEFT adapter directory, the
// form Hugging Face PEFT, vLLM and SGLang load LoRA adapters in:
//
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha",
//                              "target_modules": ["q_proj", ...], ...}
//   adapter_model.safetensors  "base_model.model.model.layers.0.self_attn.
//                              q_proj.lora_A.weight" (r, in), "...lora_B.
//                              weight" (out, r), for every adapted projection
//
// Thread-compatible.
#pragma once

#include <string>

#include <ATen/core/ScalarType.h>
#include "absl/status/status.h"
#include "common/model/policy_model.h"

namespace asympo {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";
// What PEFT puts before a model's own tensor names.
inline constexpr char kPeftPrefix[] = "base_model.model.";

// Writes `model`'s adapters to `dir` (created), in `dtype` (undefined:
// float32). `base_model` is the config's base_model_name_or_path (the
// base's directory, or its hub name). FAILED_PRECONDITION for a model
// without adapters.
absl::Status ExportPeftAdapter(const PolicyModel& model, const std::string& dir,
                               const std::string& base_model,
                               at::ScalarType dtype = at::ScalarType::Undefined);

// Reads a PEFT adapter directory into `model`'s adapters. The directory
// must be a LoRA adapter with the model's rank, alpha and target modules
// (no bias, DoRA, rsLoRA, modules_to_save, or per-layer patterns) and hold
// exactly its adapter tensors with their shapes; INVALID_ARGUMENT naming
// what differs otherwise, and nothing is changed.
absl::Status LoadPeftAdapter(const std::string& dir, PolicyModel* model);

}  // namespace asympo
