// Test helpers for the trainer: a tiny model and fixed groups whose first
// response is rewarded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "learner_server/trainer/trainer.h"

namespace asympo::learner {

// The tiny model with float32 weights, computing in `compute` (undefined:
// float32), on `device`.
inline std::unique_ptr<PolicyModel> Tiny(uint64_t seed = 3,
                                         at::ScalarType compute = at::ScalarType::Undefined,
                                         at::Device device = at::kCPU) {
  ModelOptions o;
  o.seed = seed;
  o.compute_dtype = compute;
  o.device = device;
  return PolicyModel::CreateRandom(ModelConfig::Tiny(32), o).value();
}

// Groups whose first response is rewarded: the policy should move toward it.
inline std::vector<QueuedGroup> FixedGroups(int n, uint64_t arrival = 0) {
  std::vector<QueuedGroup> out;
  for (int g = 0; g < n; ++g) {
    QueuedGroup q;
    q.arrival_version = arrival;
    q.group.set_prompt_id("g" + std::to_string(g));
    for (int t = 0; t < 3 + g % 2; ++t) q.group.add_prompt_tokens(1 + (g + t) % 20);
    for (int r = 0; r < 4; ++r) {
      v1::Response* resp = q.group.add_responses();
      for (int t = 0; t < 2 + (r + g) % 4; ++t) resp->add_tokens(5 + (3 * r + t + g) % 25);
      resp->set_reward(r == 0 ? 1.0f : 0.0f);
      for (int t = 0; t < resp->tokens_size(); ++t) resp->add_behavior_logprobs(-3.0f);
      q.tokens += q.group.prompt_tokens_size() + resp->tokens_size();
    }
    out.push_back(q);
  }
  return out;
}

inline TrainerOptions Options(Objective objective) {
  TrainerOptions o;
  o.loss.objective = objective;
  o.lr.peak_lr = 1e-2;
  o.max_grad_norm = 1.0;
  return o;
}

}  // namespace asympo::learner
