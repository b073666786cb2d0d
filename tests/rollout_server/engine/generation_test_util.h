// Sampling without a cache, for the generation tests on the CPU and on a
// GPU: the whole prefix is recomputed for every token, on the model's device,
// with the engine's sampler.
#pragma once

#include <algorithm>
#include <vector>

#include <torch/types.h>

#include "rollout_server/engine/generation.h"

namespace asympo::rollout {

inline GenerationResult Recompute(const PolicyModel& m, const GenerationRequest& r) {
  torch::NoGradGuard no_grad;
  const auto dev = m.options().device;
  std::vector<int32_t> seq = r.prompt;
  GenerationResult out;
  for (int i = 0; i < r.params.max_new_tokens; ++i) {
    const int64_t t = static_cast<int64_t>(seq.size());
    const torch::Tensor ids =
        torch::tensor(std::vector<int64_t>(seq.begin(), seq.end()), torch::kLong).unsqueeze(0);
    const torch::Tensor h =
        m.Forward(ids.to(dev), torch::arange(t, torch::kLong).unsqueeze(0).to(dev),
                  torch::ones({1, t}, torch::kBool).to(dev));
    const torch::Tensor logits = m.Logits(h)[0][t - 1];
    const int32_t tok = SampleToken(logits, r.params, i);
    out.tokens.push_back(tok);
    out.logprobs.push_back(torch::log_softmax(logits.to(torch::kFloat), 0)[tok].item<float>());
    seq.push_back(tok);
    const auto& stop = r.params.stop_token_ids;
    if (std::find(stop.begin(), stop.end(), tok) != stop.end()) break;
  }
  return out;
}

}  // namespace asympo::rollout
