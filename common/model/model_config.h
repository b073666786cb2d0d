// Configuration of the policy model: a decoder-only transformer of the
// Hugging Face Llama / Qwen3 family, read from a checkpoint's config.json or
// built in (ModelConfig::Tiny) for tests and the embedded default.
// Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace asympo {

// Rotary scaling: config.json's "rope_scaling" (transformers <= 4) or the
// scaling keys of "rope_parameters" (transformers 5). Supported types:
// "default" (none), "linear" (positions divided by factor) and "llama3"
// (Llama 3.1+ frequency bands).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  // "llama" or "qwen3" (config.json model_type).
  std::string model_type = "qwen3";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  // Absent from config.json: 128 for qwen3, hidden_size / num_attention_heads
  // for llama (as transformers).
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry biases
  bool qk_norm = false;         // Qwen3: RMSNorm on each head's q and k
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  // "float32" or "bfloat16": the dtype the checkpoint is stored in
  // (config.json's "dtype", or "torch_dtype" before transformers 4.56).
  std::string torch_dtype = "float32";

  // Parses a Hugging Face config.json as any transformers version writes it:
  // rope_theta and rope_scaling at the top (<= 4.x) or inside rope_parameters
  // (5.x; both layouts must agree when both are present), torch_dtype or
  // dtype. Missing keys take transformers' LlamaConfig / Qwen3Config
  // defaults. Unknown model types, missing sizes, rope types other than
  // default/linear/llama3, partial rotary embeddings, sliding-window layers
  // and activations other than SiLU are INVALID_ARGUMENT errors naming the
  // key.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);

  // A tiny Qwen3-style model (3 layers, hidden 64, GQA 4:2, q/k norm, tied
  // embeddings) with the given vocabulary, for tests and the local run.
  // Three layers, not two: two can copy but often settle on an off-by-one
  // position rule under RL (docs/tasks.md, "Two causes").
  static ModelConfig Tiny(int64_t vocab_size = 64);

  // Checks divisibility and ranges (heads divide, sizes positive, ...).
  absl::Status Validate() const;

  // config.json text loadable by Hugging Face transformers.
  std::string ToJson() const;

  // Parameter count (embeddings counted once when tied).
  int64_t NumParameters() const;
};

}  // namespace asympo
