#include "rollout_server/generation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

namespace asympo::rollout {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature is ", p.temperature, "; it must be finite and >= 0"));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k is ", p.top_k, "; it must be >= 0"));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p is ", p.top_p, "; it must be in (0, 1]"));
  }
  if (p.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens is ", p.max_new_tokens, "; it must be positive"));
  }
  return absl::OkStatus();
}

int32_t SampleToken(const at::Tensor& logits, const SamplingParams& params,
                    at::Generator& generator) {
  const at::Tensor row = logits.to(at::kFloat);  // (V,)
  if (params.temperature == 0) return static_cast<int32_t>(row.argmax().item<int64_t>());
  at::Tensor scaled = row / params.temperature;
  const int64_t v = scaled.size(0);
  if (params.top_k > 0 && params.top_k < v) {
    const at::Tensor kth = std::get<0>(scaled.topk(params.top_k)).select(0, params.top_k - 1);
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  if (params.top_p < 1.0) {
    // Keep the most likely tokens until their mass reaches top_p (at least one).
    const auto [sorted, order] = scaled.sort(/*dim=*/0, /*descending=*/true);
    const at::Tensor mass_before = at::softmax(sorted, 0).cumsum(0) - at::softmax(sorted, 0);
    const at::Tensor drop_sorted = mass_before >= params.top_p;
    const at::Tensor drop = at::zeros_like(drop_sorted).scatter_(0, order, drop_sorted);
    scaled = scaled.masked_fill(drop, -std::numeric_limits<float>::infinity());
  }
  const at::Tensor probs = at::softmax(scaled, 0);
  return static_cast<int32_t>(at::multinomial(probs, 1, false, generator).item<int64_t>());
}

GenerationEngine::GenerationEngine(const PolicyModel* model, GenerationOptions options)
    : model_(model), options_(options) {}

absl::StatusOr<std::vector<GenerationResult>> GenerationEngine::Generate(
    const std::vector<GenerationRequest>& requests) const {
  const ModelConfig& cfg = model_->config();
  const int64_t b = static_cast<int64_t>(requests.size());
  if (b == 0) return std::vector<GenerationResult>();
  int64_t longest = 0, most_new = 0;
  for (int64_t i = 0; i < b; ++i) {
    const GenerationRequest& r = requests[i];
    if (r.prompt.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": prompt is empty"));
    }
    for (int32_t id : r.prompt) {
      if (id < 0 || id >= cfg.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("request ", i, ": prompt token ", id,
                                                       " is outside the vocabulary [0, ",
                                                       cfg.vocab_size, ")"));
      }
    }
    absl::Status s = ValidateSamplingParams(r.params);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("request ", i, ": ", s.message()));
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    if (len + r.params.max_new_tokens > cfg.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, ": prompt (", len, " tokens) plus max_new_tokens (",
          r.params.max_new_tokens, ") exceeds max_position_embeddings ",
          cfg.max_position_embeddings));
    }
    longest = std::max(longest, len);
    most_new = std::max<int64_t>(most_new, r.params.max_new_tokens);
  }

  // No autograd bookkeeping at all: small decode steps are dominated by
  // per-operator overhead.
  c10::InferenceMode inference_mode;
  const auto device = model_->options().device;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  // Left-padded prompts: ids, key mask and positions, (B, longest).
  at::Tensor ids = at::full({b, longest}, options_.pad_token_id, long_opts);
  at::Tensor key_mask = at::zeros({b, longest + most_new}, at::kBool);
  at::Tensor next_pos = at::empty({b}, long_opts);
  {
    auto ids_a = ids.accessor<int64_t, 2>();
    auto mask_a = key_mask.accessor<bool, 2>();
    auto pos_a = next_pos.accessor<int64_t, 1>();
    for (int64_t i = 0; i < b; ++i) {
      const auto& p = requests[i].prompt;
      const int64_t n = static_cast<int64_t>(p.size()), pad = longest - n;
      for (int64_t j = 0; j < n; ++j) {
        ids_a[i][pad + j] = p[static_cast<size_t>(j)];
        mask_a[i][pad + j] = true;
      }
      pos_a[i] = n;
    }
  }
  const at::Tensor prompt_mask = key_mask.narrow(1, 0, longest);
  const at::Tensor positions = (prompt_mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  key_mask = key_mask.to(device);

  std::vector<at::Generator> gens;
  std::vector<GenerationResult> results(b);
  std::vector<bool> done(b, false);
  for (const auto& r : requests) gens.push_back(at::detail::createCPUGenerator(r.params.seed));

  KvCache cache = model_->NewCache(b, longest + most_new);
  at::Tensor hidden = model_->Forward(ids.to(device), positions.to(device),
                                      key_mask.narrow(1, 0, longest), &cache);
  // logits: (B, V) for the last position of every row.
  at::Tensor logits = model_->Logits(hidden.select(1, hidden.size(1) - 1)).to(at::kCPU);
  int64_t active = b;
  for (int64_t step = 0; step < most_new && active > 0; ++step) {
    at::Tensor next = at::full({b, 1}, options_.pad_token_id, long_opts);
    auto next_a = next.accessor<int64_t, 2>();
    const bool any_logprobs = std::any_of(requests.begin(), requests.end(), [](const auto& r) {
      return r.params.return_logprobs;
    });
    const at::Tensor logp = any_logprobs ? at::log_softmax(logits.to(at::kFloat), 1) : at::Tensor();
    // Greedy rows share one argmax over the batch.
    const at::Tensor argmax = logits.argmax(1);
    const auto argmax_a = argmax.accessor<int64_t, 1>();
    for (int64_t i = 0; i < b; ++i) {
      if (done[i]) continue;
      const SamplingParams& p = requests[i].params;
      const int32_t tok = p.temperature == 0 ? static_cast<int32_t>(argmax_a[i])
                                             : SampleToken(logits[i], p, gens[i]);
      GenerationResult& res = results[i];
      res.tokens.push_back(tok);
      if (p.return_logprobs) res.logprobs.push_back(logp[i][tok].item<float>());
      next_a[i][0] = tok;
      const bool stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) !=
                        p.stop_token_ids.end();
      if (stop || static_cast<int64_t>(res.tokens.size()) >= p.max_new_tokens) {
        res.finish_reason = stop ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH;
        done[i] = true;
        --active;
      }
    }
    if (active == 0 || step + 1 == most_new) break;
    // The new slot is a real key only for rows still generating.
    at::Tensor live = at::empty({b}, at::kBool);
    for (int64_t i = 0; i < b; ++i) live.accessor<bool, 1>()[i] = !done[i];
    key_mask.select(1, longest + step).copy_(live);
    hidden = model_->Forward(next.to(device), next_pos.unsqueeze(1).to(device),
                             key_mask.narrow(1, 0, longest + step + 1), &cache);
    next_pos += 1;
    logits = model_->Logits(hidden.select(1, 0)).to(at::kCPU);
  }
  return results;
}

}  // namespace asympo::rollout
