// Batched sampling from the policy with a KV cache.
//
// A batch of prompts is left-padded, pre-filled once, then decoded one token
// per step for every unfinished sequence, reusing the cached keys and values
// of all earlier positions. Each request has its own sampling parameters and
// its own random generator, seeded from the request, so a fixed seed gives
// the same tokens.
//
// GenerationEngine holds a const model pointer and no mutable state:
// Generate() may run concurrently from several threads, as long as nobody
// changes the model's weights meanwhile (the weight receiver swaps whole
// models between generations).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
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
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // empty unless params.return_logprobs
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
};

// Picks the next token from one row of logits (V,) with `params`, drawing
// from `generator`. Shared by the engine and by tests that recompute without
// a cache.
int32_t SampleToken(const at::Tensor& logits, const SamplingParams& params,
                    at::Generator& generator);

struct GenerationOptions {
  // Pad id used in the padded batch (never attended to).
  int32_t pad_token_id = 0;
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

 private:
  // The prefill and the decode loop for validated requests (may throw).
  std::vector<GenerationResult> Decode(const std::vector<GenerationRequest>& requests,
                                       int64_t longest, int64_t most_new) const;

  const PolicyModel* model_;
  GenerationOptions options_;
};

}  // namespace asympo::rollout
