// Builders shared by the loss-library tests: random padded batches of
// variable-length responses in float64, so that gradients can be compared
// against closed forms and finite differences tightly.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "learner_server/loss/policy_loss.h"

namespace asympo::learner::testing {

struct Batch {
  torch::Tensor logp;      // (N, T) float64 leaf, requires grad
  torch::Tensor mask;      // (N, T) bool
  torch::Tensor rewards;   // (N,) float64
  torch::Tensor group;     // (N,) int64
  torch::Tensor behavior;  // (N, T) float64
  int64_t groups = 0;
  std::vector<int64_t> lengths;
  std::vector<int64_t> group_sizes;

  LossInputs Inputs(bool with_behavior = true) const {
    LossInputs in;
    in.token_logprobs = logp;
    in.mask = mask;
    in.rewards = rewards;
    in.group_index = group;
    in.num_groups = groups;
    if (with_behavior) in.behavior_logprobs = behavior;
    return in;
  }
};

// Groups of the given sizes; response lengths in [1, max_len]; rewards drawn
// from {0, 0.25, 0.5, 0.75, 1} (exactly representable); log-probs in
// [-4, -0.01]; padding filled with NaN to prove it is ignored.
inline Batch RandomBatch(const std::vector<int64_t>& group_sizes, int64_t max_len, uint64_t seed) {
  torch::manual_seed(seed);
  Batch b;
  b.groups = static_cast<int64_t>(group_sizes.size());
  b.group_sizes = group_sizes;
  std::vector<int64_t> group;
  for (int64_t g = 0; g < b.groups; ++g) {
    for (int64_t i = 0; i < group_sizes[g]; ++i) group.push_back(g);
  }
  const int64_t n = static_cast<int64_t>(group.size());
  b.group = torch::tensor(group, torch::kLong);
  const torch::Tensor len = torch::randint(1, max_len + 1, {n}, torch::kLong);
  b.lengths.assign(len.data_ptr<int64_t>(), len.data_ptr<int64_t>() + n);
  b.mask = torch::arange(max_len).unsqueeze(0) < len.unsqueeze(1);
  b.rewards = torch::randint(0, 5, {n}, torch::kDouble) * 0.25;
  const torch::Tensor nan = torch::full({n, max_len}, NAN, torch::kDouble);
  b.logp = torch::where(b.mask, -torch::rand({n, max_len}, torch::kDouble) * 3.99 - 0.01, nan)
               .requires_grad_(true);
  b.behavior = torch::where(
      b.mask, b.logp.detach() + (torch::rand({n, max_len}, torch::kDouble) - 0.5) * 0.8, nan);
  return b;
}

inline PolicyLoss MakeLoss(Objective objective, PolicyLossOptions options = {}) {
  options.objective = objective;
  return PolicyLoss::Create(options).value();
}

inline torch::Tensor GradOf(const torch::Tensor& loss, const torch::Tensor& wrt) {
  return torch::autograd::grad({loss}, {wrt}, {}, /*retain_graph=*/true)[0];
}

}  // namespace asympo::learner::testing
