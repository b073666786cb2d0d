// Low-rank adapters (LoRA) on the decoder layers' linear projections: a
// targeted projection y = x W^T + b computes
//
//   y = x W^T + b + (alpha / rank) * (x A^T) B^T
//
// with A (rank, in) and B (out, rank) trained and W, b frozen. B starts at
// zero, so that a fresh adapter is the base exactly; A starts uniform in
// [-1/sqrt(in), 1/sqrt(in)] (PEFT's Kaiming-uniform with a = sqrt(5)).
// Adapter tensors are named as PEFT names them inside the model
// ("model.layers.0.self_attn.q_proj.lora_A.weight"); a PEFT
// adapter_model.safetensors prefixes "base_model.model.".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asympo {

// The projections an adapter may target, in the order of --lora_targets'
// spelling.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kLoraTargetCount = 7;

// --lora_targets' short name of each target ("q", ..., "down").
const char* LoraTargetName(LoraTarget target);
// Its module within a decoder layer, as Hugging Face names it
// ("self_attn.q_proj", ..., "mlp.down_proj").
const char* LoraModuleName(LoraTarget target);

struct LoraOptions {
  // 0: no adapters (every weight trains).
  int64_t rank = 0;
  // The adapters' output is scaled by alpha / rank.
  double alpha = 0;
  // A bit per LoraTarget (1 << target).
  uint32_t targets = 0;

  bool enabled() const { return rank > 0; }
  double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 0.0; }
  bool targets_module(LoraTarget t) const { return (targets >> static_cast<int>(t)) & 1U; }
};

// Every target: what --lora_targets defaults to ("all").
inline constexpr uint32_t kAllLoraTargets = (1U << kLoraTargetCount) - 1;

// --lora_targets: a comma-separated list of q, k, v, o, gate, up, down, or
// "all" (every one), "attention" (q,k,v,o), "mlp" (gate,up,down).
// INVALID_ARGUMENT names an unknown or repeated entry, or an empty list.
absl::StatusOr<uint32_t> ParseLoraTargets(absl::string_view text);
// The canonical spelling of a target set ("q,k,v,o,gate,up,down").
std::string LoraTargetsName(uint32_t targets);

// Checks a whole LoraOptions as the flags give it: rank 0 (off, then alpha
// and targets are ignored) or in [1, 4096]; alpha > 0; targets not empty.
// INVALID_ARGUMENT names the flag.
absl::Status ValidateLoraOptions(const LoraOptions& lora);

// One projection's adapter, float32 (the trained values).
struct LoraAdapter {
  at::Tensor a;  // (rank, in)
  at::Tensor b;  // (out, rank)
  bool defined() const { return a.defined(); }
};

// x W^T + bias + scale * (x A^T) B^T, with the adapter cast to x's dtype;
// without an adapter (undefined), at::linear(x, weight, bias).
at::Tensor LoraLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const LoraAdapter& adapter, double scale);

// W + scale * B A in float32, cast to W's dtype and device: the merged
// weight a model without adapters would hold.
at::Tensor MergeLoraWeight(const at::Tensor& weight, const LoraAdapter& adapter, double scale);

// "<module prefix>.lora_A.weight" and "...lora_B.weight" for a projection
// whose weight is named "<module prefix>.weight".
std::string LoraAName(absl::string_view weight_name);
std::string LoraBName(absl::string_view weight_name);

}  // namespace asympo
