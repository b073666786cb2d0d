#include "common/model/lora.h"

#include <ATen/ATen.h>
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/model/lora_flags.h"

namespace asympo {
namespace {

constexpr const char* kNames[kLoraTargetCount] = {"q", "k", "v", "o", "gate", "up", "down"};
constexpr const char* kModules[kLoraTargetCount] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
constexpr uint32_t kAttention = 0xF;  // q, k, v, o
constexpr uint32_t kMlp = 0x70;       // gate, up, down

std::string AdapterName(absl::string_view weight_name, absl::string_view which) {
  absl::string_view module = weight_name;
  absl::ConsumeSuffix(&module, ".weight");
  return absl::StrCat(module, ".lora_", which, ".weight");
}

}  // namespace

const char* LoraTargetName(LoraTarget target) { return kNames[static_cast<int>(target)]; }
const char* LoraModuleName(LoraTarget target) { return kModules[static_cast<int>(target)]; }

absl::StatusOr<uint32_t> ParseLoraTargets(absl::string_view text) {
  uint32_t out = 0;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    uint32_t bits = 0;
    if (part == "all") {
      bits = kAllLoraTargets;
    } else if (part == "attention") {
      bits = kAttention;
    } else if (part == "mlp") {
      bits = kMlp;
    } else {
      for (int i = 0; i < kLoraTargetCount; ++i) {
        if (part == kNames[i]) bits = 1U << i;
      }
    }
    if (bits == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora_targets=", text, ": unknown target \"", part,
                       "\" (expected a comma-separated list of q, k, v, o, gate, up, down, or all, "
                       "attention, mlp)"));
    }
    if ((out & bits) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora_targets=", text, ": \"", part, "\" repeats a target"));
    }
    out |= bits;
  }
  return out;
}

std::string LoraTargetsName(uint32_t targets) {
  std::vector<std::string> names;
  for (int i = 0; i < kLoraTargetCount; ++i) {
    if ((targets >> i) & 1U) names.emplace_back(kNames[i]);
  }
  return absl::StrJoin(names, ",");
}

absl::Status ValidateLoraOptions(const LoraOptions& lora) {
  if (lora.rank == 0) return absl::OkStatus();
  if (lora.rank < 0 || lora.rank > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora_rank=", lora.rank, ": expected 0 (no adapters) to 4096"));
  }
  if (!(lora.alpha > 0) || lora.alpha > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora_alpha=", lora.alpha, ": expected a positive number"));
  }
  if ((lora.targets & kAllLoraTargets) == 0 || (lora.targets & ~kAllLoraTargets) != 0) {
    return absl::InvalidArgumentError("--lora_targets: no projection to adapt");
  }
  return absl::OkStatus();
}

absl::StatusOr<LoraOptions> LoraFromFlags(int64_t rank, double alpha, absl::string_view targets) {
  LoraOptions o;
  o.rank = rank;
  o.alpha = alpha == 0 ? 2.0 * static_cast<double>(rank) : alpha;
  if (rank != 0) {
    absl::StatusOr<uint32_t> parsed = ParseLoraTargets(targets);
    if (!parsed.ok()) return parsed.status();
    o.targets = *parsed;
  }
  if (absl::Status s = ValidateLoraOptions(o); !s.ok()) return s;
  return o;
}

at::Tensor LoraLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const LoraAdapter& adapter, double scale) {
  at::Tensor y = at::linear(x, weight, bias);
  if (!adapter.defined()) return y;
  const at::ScalarType dt = x.scalar_type();
  const at::Tensor low = at::linear(x, adapter.a.to(dt));
  // y += scale * low B^T as one GEMM into y (no (tokens, out) temporaries;
  // the base's backward does not read y).
  const int64_t rank = adapter.a.size(0), out = y.size(-1);
  y.view({-1, out}).addmm_(low.reshape({-1, rank}), adapter.b.to(dt).t(), /*beta=*/1,
                           /*alpha=*/scale);
  return y;
}

at::Tensor MergeLoraWeight(const at::Tensor& weight, const LoraAdapter& adapter, double scale) {
  const at::Tensor delta = at::matmul(adapter.b.to(at::kFloat), adapter.a.to(at::kFloat));
  return (weight.to(at::kFloat) + delta.to(weight.device()) * scale).to(weight.scalar_type());
}

std::string LoraAName(absl::string_view weight_name) { return AdapterName(weight_name, "A"); }
std::string LoraBName(absl::string_view weight_name) { return AdapterName(weight_name, "B"); }

}  // namespace asympo
