#include "rollout_server/generation.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

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

namespace {

// INVALID_ARGUMENT naming the request for an empty prompt, a token outside
// the vocabulary, bad sampling parameters or a sequence beyond the model's
// positions. Sets the longest prompt and the most new tokens asked for.
absl::Status ValidateRequests(const std::vector<GenerationRequest>& requests,
                              const ModelConfig& cfg, int64_t* longest, int64_t* most_new) {
  *longest = 0;
  *most_new = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
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
      return absl::InvalidArgumentError(
          absl::StrCat("request ", i, ": prompt (", len, " tokens) plus max_new_tokens (",
                       r.params.max_new_tokens, ") exceeds max_position_embeddings ",
                       cfg.max_position_embeddings));
    }
    *longest = std::max(*longest, len);
    *most_new = std::max<int64_t>(*most_new, r.params.max_new_tokens);
  }
  return absl::OkStatus();
}

// The prompts left-padded to `longest`, on the CPU.
struct PaddedPrompts {
  at::Tensor ids;        // (B, longest) int64
  at::Tensor key_mask;   // (B, longest + most_new) bool: real prompt tokens so far
  at::Tensor positions;  // (B, longest) int64 rotary positions (0 on padding)
  at::Tensor next_pos;   // (B,) int64: the position of each row's next token
};

PaddedPrompts LeftPad(const std::vector<GenerationRequest>& requests, int64_t longest,
                      int64_t most_new, int32_t pad_token_id) {
  const int64_t b = static_cast<int64_t>(requests.size());
  PaddedPrompts out;
  out.ids = at::full({b, longest}, pad_token_id, at::kLong);
  out.key_mask = at::zeros({b, longest + most_new}, at::kBool);
  out.next_pos = at::empty({b}, at::kLong);
  auto ids = out.ids.accessor<int64_t, 2>();
  auto mask = out.key_mask.accessor<bool, 2>();
  auto pos = out.next_pos.accessor<int64_t, 1>();
  for (int64_t i = 0; i < b; ++i) {
    const auto& p = requests[static_cast<size_t>(i)].prompt;
    const int64_t n = static_cast<int64_t>(p.size()), pad = longest - n;
    for (int64_t j = 0; j < n; ++j) {
      ids[i][pad + j] = p[static_cast<size_t>(j)];
      mask[i][pad + j] = true;
    }
    pos[i] = n;
  }
  const at::Tensor prompt_mask = out.key_mask.narrow(1, 0, longest);
  out.positions = (prompt_mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  return out;
}

// The decoding state of a batch: per-row generators, results and whether
// each row has finished.
struct DecodeState {
  std::vector<at::Generator> generators;
  std::vector<GenerationResult> results;
  std::vector<bool> done;
  int64_t active = 0;
};

// Picks the next token of every unfinished row from `logits` (B, V) on the
// CPU, appends it to the row's result and writes it into `next` (B, 1);
// rows that hit a stop id or their max_new_tokens finish.
void SampleNextTokens(const at::Tensor& logits, const std::vector<GenerationRequest>& requests,
                      DecodeState* state, at::Tensor* next) {
  const int64_t b = static_cast<int64_t>(requests.size());
  auto next_a = next->accessor<int64_t, 2>();
  const bool any_logprobs = std::any_of(requests.begin(), requests.end(),
                                        [](const auto& r) { return r.params.return_logprobs; });
  const at::Tensor logp = any_logprobs ? at::log_softmax(logits.to(at::kFloat), 1) : at::Tensor();
  // Greedy rows share one argmax over the batch.
  const at::Tensor argmax = logits.argmax(1);
  const auto argmax_a = argmax.accessor<int64_t, 1>();
  for (int64_t i = 0; i < b; ++i) {
    if (state->done[i]) continue;
    const SamplingParams& p = requests[static_cast<size_t>(i)].params;
    const int32_t tok = p.temperature == 0 ? static_cast<int32_t>(argmax_a[i])
                                           : SampleToken(logits[i], p, state->generators[i]);
    GenerationResult& res = state->results[i];
    res.tokens.push_back(tok);
    if (p.return_logprobs) res.logprobs.push_back(logp[i][tok].item<float>());
    next_a[i][0] = tok;
    const bool stop =
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
    if (stop || static_cast<int64_t>(res.tokens.size()) >= p.max_new_tokens) {
      res.finish_reason = stop ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH;
      state->done[i] = true;
      --state->active;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<GenerationResult>> GenerationEngine::Generate(
    const std::vector<GenerationRequest>& requests) const {
  if (requests.empty()) return std::vector<GenerationResult>();
  int64_t longest = 0, most_new = 0;
  ASYMPO_RETURN_IF_ERROR(ValidateRequests(requests, model_->config(), &longest, &most_new));
  return GuardTorch("generation", [&]() -> absl::StatusOr<std::vector<GenerationResult>> {
    return Decode(requests, longest, most_new);
  });
}

std::vector<GenerationResult> GenerationEngine::Decode(
    const std::vector<GenerationRequest>& requests, int64_t longest, int64_t most_new) const {
  // No autograd bookkeeping at all: small decode steps are dominated by
  // per-operator overhead.
  c10::InferenceMode inference_mode;
  const int64_t b = static_cast<int64_t>(requests.size());
  const auto device = model_->options().device;
  PaddedPrompts prompts = LeftPad(requests, longest, most_new, options_.pad_token_id);
  at::Tensor key_mask = prompts.key_mask.to(device);
  DecodeState state;
  state.results.resize(static_cast<size_t>(b));
  state.done.assign(static_cast<size_t>(b), false);
  state.active = b;
  for (const auto& r : requests) {
    state.generators.push_back(at::detail::createCPUGenerator(r.params.seed));
  }

  KvCache cache = model_->NewCache(b, longest + most_new);
  at::Tensor hidden = model_->Forward(prompts.ids.to(device), prompts.positions.to(device),
                                      key_mask.narrow(1, 0, longest), &cache);
  // logits: (B, V) for the last position of every row.
  at::Tensor logits = model_->Logits(hidden.select(1, hidden.size(1) - 1)).to(at::kCPU);
  for (int64_t step = 0; step < most_new && state.active > 0; ++step) {
    at::Tensor next = at::full({b, 1}, options_.pad_token_id, at::kLong);
    SampleNextTokens(logits, requests, &state, &next);
    if (state.active == 0 || step + 1 == most_new) break;
    // The new slot is a real key only for rows still generating.
    at::Tensor live = at::empty({b}, at::kBool);
    for (int64_t i = 0; i < b; ++i) live.accessor<bool, 1>()[i] = !state.done[i];
    key_mask.select(1, longest + step).copy_(live);
    hidden = model_->Forward(next.to(device), prompts.next_pos.unsqueeze(1).to(device),
                             key_mask.narrow(1, 0, longest + step + 1), &cache);
    prompts.next_pos += 1;
    logits = model_->Logits(hidden.select(1, 0)).to(at::kCPU);
  }
  return std::move(state.results);
}

}  // namespace asympo::rollout
