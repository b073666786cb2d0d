#include "rollout_server/engine/generation.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"
#include "rollout_server/engine/decode_graph.h"
#include "rollout_server/engine/sampling.h"

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

GenerationResult ResultOfRow(const at::Tensor& tokens, const at::Tensor& logprobs, int64_t n,
                             const SamplingParams& params) {
  GenerationResult r;
  const auto tok = tokens.accessor<int64_t, 1>();
  for (int64_t j = 0; j < n; ++j) r.tokens.push_back(static_cast<int32_t>(tok[j]));
  if (params.return_logprobs) {
    const auto lp = logprobs.accessor<float, 1>();
    for (int64_t j = 0; j < n; ++j) r.logprobs.push_back(lp[j]);
  }
  const auto& stops = params.stop_token_ids;
  const bool stop = n > 0 && std::find(stops.begin(), stops.end(), r.tokens.back()) != stops.end();
  r.finish_reason = stop ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH;
  return r;
}

int32_t SampleToken(const at::Tensor& logits, const SamplingParams& params, int64_t step) {
  const BatchSampler sampler({&params}, logits.device());
  const at::Tensor s = at::full({1}, step, logits.options().dtype(at::kLong));
  return static_cast<int32_t>(sampler.Sample(logits.unsqueeze(0), s).item<int64_t>());
}

absl::Status CheckTokenIds(const std::vector<int32_t>& ids, int64_t vocab_size,
                           absl::string_view what) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const GenerationRequest& r, const ModelConfig& cfg) {
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  ASYMPO_RETURN_IF_ERROR(CheckTokenIds(r.prompt, cfg.vocab_size, "prompt token"));
  ASYMPO_RETURN_IF_ERROR(ValidateSamplingParams(r.params));
  const int64_t len = static_cast<int64_t>(r.prompt.size());
  if (len + r.params.max_new_tokens > cfg.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", len, " tokens) plus max_new_tokens (", r.params.max_new_tokens,
                     ") exceeds max_position_embeddings ", cfg.max_position_embeddings));
  }
  return absl::OkStatus();
}

GenerationEngine::GenerationEngine(const PolicyModel* model, GenerationOptions options)
    : model_(model), options_(options) {}

namespace {

// INVALID_ARGUMENT naming the request (ValidateRequest). Sets the longest
// prompt and the most new tokens asked for.
absl::Status ValidateRequests(const std::vector<GenerationRequest>& requests,
                              const ModelConfig& cfg, int64_t* longest, int64_t* most_new) {
  *longest = 0;
  *most_new = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    if (absl::Status s = ValidateRequest(r, cfg); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": ", s.message()));
    }
    *longest = std::max(*longest, static_cast<int64_t>(r.prompt.size()));
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

// The decode loop's state, all on the model's device, with static shapes:
// a decode step reads and writes these tensors in place (a CUDA graph
// replays it).
struct DecodeState {
  at::Tensor logits;     // (B, V): the logits of response token `step`
  at::Tensor step;       // (1,) int64: the response token being sampled
  at::Tensor slot;       // (1,) int64: the cache slot of that token
  at::Tensor positions;  // (B, 1) int64: its rotary position
  at::Tensor key_mask;   // (B, capacity) bool: the real keys
  at::Tensor last;       // (B, 1) int64: the token just sampled
  at::Tensor done;       // (B,) bool
  at::Tensor lengths;    // (B,) int64: tokens generated per row
  at::Tensor max_new;    // (B,) int64
  at::Tensor stop_ids;   // (B, S) int64, padded with -1
  at::Tensor tokens;     // (B, most_new) int64
  at::Tensor logprobs;   // (B, most_new) float32; undefined unless asked for
  KvCache cache;
};

DecodeState NewDecodeState(const std::vector<GenerationRequest>& requests, int64_t most_new,
                           const PaddedPrompts& prompts, at::Device device, int32_t pad) {
  const int64_t b = static_cast<int64_t>(requests.size());
  size_t most_stops = 1;
  bool logprobs = false;
  for (const auto& r : requests) {
    most_stops = std::max(most_stops, r.params.stop_token_ids.size());
    logprobs = logprobs || r.params.return_logprobs;
  }
  at::Tensor max_new = at::empty({b}, at::kLong);
  at::Tensor stops = at::full({b, static_cast<int64_t>(most_stops)}, -1, at::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const SamplingParams& p = requests[static_cast<size_t>(i)].params;
    max_new[i] = static_cast<int64_t>(p.max_new_tokens);
    for (size_t j = 0; j < p.stop_token_ids.size(); ++j) {
      stops[i][static_cast<int64_t>(j)] = static_cast<int64_t>(p.stop_token_ids[j]);
    }
  }
  const auto on = at::TensorOptions().device(device);
  DecodeState st;
  st.step = at::zeros({1}, on.dtype(at::kLong));
  st.slot = at::full({1}, prompts.ids.size(1), on.dtype(at::kLong));
  st.positions = prompts.next_pos.unsqueeze(1).to(device);
  st.key_mask = prompts.key_mask.to(device);
  st.last = at::full({b, 1}, pad, on.dtype(at::kLong));
  st.done = at::zeros({b}, on.dtype(at::kBool));
  st.lengths = at::zeros({b}, on.dtype(at::kLong));
  st.max_new = max_new.to(device);
  st.stop_ids = stops.to(device);
  st.tokens = at::full({b, most_new}, pad, on.dtype(at::kLong));
  if (logprobs) st.logprobs = at::zeros({b, most_new}, on.dtype(at::kFloat));
  return st;
}

// Samples response token `step` of every unfinished row from st->logits
// and records it; rows that hit a stop id or their max_new_tokens finish.
void SampleStep(const BatchSampler& sampler, int32_t pad, DecodeState* st) {
  const at::Tensor live = st->done.logical_not();
  const at::Tensor tok = at::where(live, sampler.Sample(st->logits, st->step),
                                   at::full({}, pad, st->lengths.options()));  // (B,)
  st->tokens.index_copy_(1, st->step, tok.unsqueeze(1));
  if (st->logprobs.defined()) {
    const at::Tensor lp = at::log_softmax(st->logits.to(at::kFloat), 1).gather(1, tok.unsqueeze(1));
    st->logprobs.index_copy_(1, st->step, lp);
  }
  st->lengths.add_(live);
  const at::Tensor hit =
      at::logical_or((st->stop_ids == tok.unsqueeze(1)).any(1), st->lengths >= st->max_new);
  st->done.logical_or_(at::logical_and(live, hit));
  st->last.copy_(tok.unsqueeze(1));
}

// Runs the model on the tokens just sampled (slot st->slot) and advances
// step, slot and positions: st->logits then hold the next token's logits.
// Attention spans the first `visible` cache slots (-1: all of them, the
// static shape a CUDA graph needs).
void ForwardStep(const PolicyModel& model, int64_t visible, DecodeState* st) {
  // The new slot is a real key only for rows still generating.
  st->key_mask.index_copy_(1, st->slot, st->done.logical_not().unsqueeze(1));
  const at::Tensor hidden =
      model.DecodeStep(st->last, st->positions, st->slot, st->key_mask, &st->cache, visible);
  st->logits.copy_(model.Logits(hidden.select(1, 0)));
  st->positions.add_(1);
  st->slot.add_(1);
  st->step.add_(1);
}

// The host's copy of the results.
std::vector<GenerationResult> CollectResults(const std::vector<GenerationRequest>& requests,
                                             const DecodeState& st) {
  const at::Tensor tokens = st.tokens.to(at::kCPU), lengths = st.lengths.to(at::kCPU);
  const at::Tensor logprobs = st.logprobs.defined() ? st.logprobs.to(at::kCPU) : at::Tensor();
  const auto len = lengths.accessor<int64_t, 1>();
  std::vector<GenerationResult> results;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t row = static_cast<int64_t>(i);
    results.push_back(ResultOfRow(tokens[row], logprobs.defined() ? logprobs[row] : at::Tensor(),
                                  len[row], requests[i].params));
  }
  return results;
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

int32_t GenerationEngine::StopCheckEvery() const {
  if (options_.stop_check_every > 0) return options_.stop_check_every;
  return model_->options().device.is_cpu() ? 1 : 8;
}

std::vector<GenerationResult> GenerationEngine::Decode(
    const std::vector<GenerationRequest>& requests, int64_t longest, int64_t most_new) const {
  // No autograd bookkeeping at all: small decode steps are dominated by
  // per-operator overhead.
  c10::InferenceMode inference_mode;
  const auto device = model_->options().device;
  const int32_t pad = options_.pad_token_id;
  const PaddedPrompts prompts = LeftPad(requests, longest, most_new, pad);
  std::vector<const SamplingParams*> params;
  for (const auto& r : requests) params.push_back(&r.params);
  const BatchSampler sampler(params, device);
  DecodeState st = NewDecodeState(requests, most_new, prompts, device, pad);
  st.cache = model_->NewCache(static_cast<int64_t>(requests.size()), longest + most_new);
  const at::Tensor hidden = model_->Forward(prompts.ids.to(device), prompts.positions.to(device),
                                            st.key_mask.narrow(1, 0, longest), &st.cache);
  st.logits = model_->Logits(hidden.select(1, hidden.size(1) - 1)).contiguous();

  // Steps 0 .. most_new - 2 sample and run the model; the last only samples.
  // Eager steps attend over the filled slots only; a graphed step over the
  // whole cache.
  int64_t s = 0;
  const auto step = [&](int64_t visible) {
    SampleStep(sampler, pad, &st);
    ForwardStep(*model_, visible, &st);
  };
  std::unique_ptr<DecodeGraph> graph;
  const int32_t check_every = StopCheckEvery();
  for (; s + 1 < most_new; ++s) {
    if (graph != nullptr) {
      graph->Replay();
    } else if (s == 0 && options_.cuda_graphs && device.is_cuda()) {
      // Runs step 0, then captures it.
      graph = CaptureDecodeGraph([&] { step(/*visible=*/-1); }, device);
    } else {
      step(longest + s + 1);
    }
    if ((s + 1) % check_every == 0 && st.done.all().item<bool>()) break;
  }
  if (s + 1 == most_new) SampleStep(sampler, pad, &st);
  return CollectResults(requests, st);
}

}  // namespace asympo::rollout
