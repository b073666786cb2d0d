// Batched sampling from the policy with a KV cache.
//
// A batch of prompts is left-padded and pre-filled once into a KV cache
// allocated for the longest prompt plus the most new tokens; then every row
// decodes one token per step with static shapes (PolicyModel::DecodeStep),
// sampling on the model's device (BatchSampler), the tokens staying there
// until the end. The host only asks every few steps whether all rows have
// finished. On a CUDA device the step is captured once as a CUDA graph and
// replayed. Each request has its own sampling parameters and seed, and its
// tokens depend on nothing else (sampling.h), so a fixed seed gives the
// same tokens in any batch.
//
// GenerationEngine holds a const model pointer and no mutable state:
// Generate() may run concurrently from several threads, as long as nobody
// changes the model's weights meanwhile (the weight receiver swaps whole
// models between generations). Each call captures its own CUDA graph
// (thread-local capture mode), so other threads' CUDA work goes on.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "asympo/v1/rollout.pb.h"
#include "common/model/policy_model.h"

namespace asympo::rollout {

struct SamplingParams {
  // 0 means greedy (argmax); otherwise logits are divided by it.
  double temperature = 1.0;
  // Keep only the k most likely tokens; 0 disables.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability reaches
  // top_p (nucleus sampling); 1 disables.
  double top_p = 1.0;
  int32_t max_new_tokens = 128;
  // Generation stops after any of these ids (the stop id is kept).
  std::vector<int32_t> stop_token_ids;
  uint64_t seed = 0;
  // Also return log pi(token) under the unmodified policy (temperature 1, no
  // top-k/top-p) for each sampled token: the behavior log-probs of the grpo
  // baseline.
  bool return_logprobs = false;
};

absl::Status ValidateSamplingParams(const SamplingParams& params);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  // Multi-turn (ContinuousEngine only): at a stop token, or after
  // params.max_new_tokens tokens of a turn, the sequence pauses instead of
  // finishing, keeping its slot and its keys and values until Resume
  // (an environment's tokens, then the next turn) or End.
  // `response_budget` bounds its whole response, turns and inserted tokens
  // together (0: params.max_new_tokens).
  bool multi_turn = false;
  int32_t response_budget = 0;
};

// INVALID_ARGUMENT "<what> <id> is outside the vocabulary [0, V)" for the
// first of `ids` outside [0, vocab_size).
absl::Status CheckTokenIds(const std::vector<int32_t>& ids, int64_t vocab_size,
                           absl::string_view what);

// INVALID_ARGUMENT for an empty prompt, a token outside the vocabulary, bad
// sampling parameters or a prompt plus max_new_tokens beyond
// max_position_embeddings.
absl::Status ValidateRequest(const GenerationRequest& request, const ModelConfig& config);

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // empty unless params.return_logprobs
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  // The policy versions that sampled the first and the last token
  // (ContinuousEngine; GenerationEngine leaves them 0: one model samples a
  // whole batch, and its caller knows its version).
  uint64_t first_version = 0;
  uint64_t last_version = 0;
  // Multi-turn: one entry per token, false where Resume inserted it (empty:
  // every token generated). `logprobs` then holds the generated tokens' only.
  std::vector<bool> loss_mask;
};

// The result of one row of a decode loop's host copies: the first `n` of
// `tokens` (n, int64, host) and, when params.return_logprobs, of
// `logprobs` (float32, host); the finish reason from the last token.
GenerationResult ResultOfRow(const at::Tensor& tokens, const at::Tensor& logprobs, int64_t n,
                             const SamplingParams& params);

// Picks response token `step` from one row of logits (V,) with `params`:
// the engine's sampler (rollout_server/engine/sampling.h) on a batch of one. For
// tests that recompute without a cache.
int32_t SampleToken(const at::Tensor& logits, const SamplingParams& params, int64_t step);

struct GenerationOptions {
  // Pad id used in the padded batch (never attended to).
  int32_t pad_token_id = 0;
  // Replay the decode step as a CUDA graph on a CUDA device, where this
  // build has CUDA (decode_graph.h); ignored on the CPU.
  bool cuda_graphs = true;
  // How many decode steps run between checks of whether every row has
  // finished (the only host synchronisation of the decode loop); 0: 1 on
  // the CPU, 8 on a GPU.
  int32_t stop_check_every = 0;
};

class GenerationEngine {
 public:
  GenerationEngine(const PolicyModel* model, GenerationOptions options = {});

  // Generates one result per request, in order. INVALID_ARGUMENT for an
  // empty prompt, a token outside the vocabulary, bad sampling parameters or
  // a prompt plus max_new_tokens beyond max_position_embeddings; an error
  // from LibTorch (e.g. out of memory) as a status naming "generation".
  absl::StatusOr<std::vector<GenerationResult>> Generate(
      const std::vector<GenerationRequest>& requests) const;

  const PolicyModel* model() const { return model_; }

 private:
  // The prefill and the decode loop for validated requests (may throw).
  std::vector<GenerationResult> Decode(const std::vector<GenerationRequest>& requests,
                                       int64_t longest, int64_t most_new) const;
  int32_t StopCheckEvery() const;

  const PolicyModel* model_;
  GenerationOptions options_;
};

}  // namespace asympo::rollout
