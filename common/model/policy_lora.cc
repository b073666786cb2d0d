// PolicyModel's low-rank adapters (common/model/lora.h): creating them,
// applying them in a projection, and merging them into the weights.
#include <array>
#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "common/model/policy_model.h"

namespace asympo {
namespace {

// A's generator: its own stream, so that a model's weights are the same
// with and without adapters for a given seed.
constexpr uint64_t kAdapterSeedSalt = 0x6c6f7261;  // "lora"

// A decoder layer's projection weights in LoraTarget order (`layer`: a
// PolicyModel::Layer).
template <typename Layer>
std::array<const at::Tensor*, kLoraTargetCount> Projections(const Layer& layer) {
  return {&layer.q_proj,    &layer.k_proj,  &layer.v_proj,   &layer.o_proj,
          &layer.gate_proj, &layer.up_proj, &layer.down_proj};
}

}  // namespace

void PolicyModel::AddAdapters() {
  at::Generator gen = at::detail::createCPUGenerator(options_.seed ^ kAdapterSeedSalt);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    const auto weights = Projections(layer);
    for (int t = 0; t < kLoraTargetCount; ++t) {
      const auto target = static_cast<LoraTarget>(t);
      if (!options_.lora.targets_module(target)) continue;
      const int64_t out = weights[static_cast<size_t>(t)]->size(0),
                    in = weights[static_cast<size_t>(t)]->size(1);
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      at::Tensor a = at::empty({options_.lora.rank, in}, at::kFloat).uniform_(-bound, bound, gen);
      at::Tensor b = at::zeros({out, options_.lora.rank}, at::kFloat);
      const std::string name = absl::StrCat("model.layers.", i, ".", LoraModuleName(target));
      LoraAdapter& adapter = layer.lora[static_cast<size_t>(t)];
      adapter.a = a.to(options_.device).set_requires_grad(true);
      adapter.b = b.to(options_.device).set_requires_grad(true);
      params_.emplace_back(LoraAName(name + ".weight"), adapter.a);
      params_.emplace_back(LoraBName(name + ".weight"), adapter.b);
    }
  }
}

at::Tensor PolicyModel::Project(const Layer& layer, LoraTarget target, const at::Tensor& x,
                                const at::Tensor& weight, const at::Tensor& bias) const {
  return LoraLinear(x, ComputeWeight(weight), ComputeWeight(bias),
                    layer.lora[static_cast<size_t>(target)], options_.lora.scale());
}

std::vector<std::pair<std::string, at::Tensor>> PolicyModel::MergedWeights() const {
  at::NoGradGuard no_grad;
  // Each adapted weight (the very tensor weights_ holds) and its adapter.
  std::map<const void*, const LoraAdapter*> adapters;
  for (const Layer& layer : layers_) {
    const auto weights = Projections(layer);
    for (int t = 0; t < kLoraTargetCount; ++t) {
      const LoraAdapter& a = layer.lora[static_cast<size_t>(t)];
      if (a.defined()) adapters[weights[static_cast<size_t>(t)]->unsafeGetTensorImpl()] = &a;
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(weights_.size());
  for (const auto& [name, w] : weights_) {
    auto it = adapters.find(w.unsafeGetTensorImpl());
    out.emplace_back(name, it == adapters.end()
                               ? w.detach()
                               : MergeLoraWeight(w.detach(), *it->second, options_.lora.scale()));
  }
  return out;
}

}  // namespace asympo
