// Model configurations the benchmarks use, and the FLOP count of one
// training step, shared by bench/model_bench.cc (the Python twin,
// bench/model_bench.py, repeats the same numbers).
#pragma once

#include <string>

#include "common/model/model_config.h"

namespace asympo::bench {

// "tiny": the built-in test model with a 512-token vocabulary.
// "100m": 12 layers, hidden 768, 12 heads (4 KV heads), FFN 2048, vocabulary
// 32000, tied embeddings: 100.3M parameters.
// "qwen3-0.6b", "qwen3-1.7b": Qwen3-0.6B's and Qwen3-1.7B's shapes (28
// layers, 16 query and 8 KV heads of 128, vocabulary 151936, tied
// embeddings, QK-norm), randomly initialized: the GPU benchmarks' models.
// "300m": 24 layers, hidden 1024, 16 heads (8 KV heads of 64), FFN 2816,
// vocabulary 32000, tied embeddings: 315.9M parameters (the memory plan's
// larger CPU check, bench/memory_plan_bench.cc).
inline ModelConfig BenchConfig(const std::string& name) {
  if (name == "qwen3-0.6b" || name == "qwen3-1.7b") {
    ModelConfig c = ModelConfig::Tiny(151936);
    const bool small = name == "qwen3-0.6b";
    c.hidden_size = small ? 1024 : 2048;
    c.intermediate_size = small ? 3072 : 6144;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 1000000.0;
    c.max_position_embeddings = 40960;
    return c;
  }
  if (name == "300m") {
    ModelConfig c = ModelConfig::Tiny(32000);
    c.hidden_size = 1024;
    c.intermediate_size = 2816;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.max_position_embeddings = 4096;
    return c;
  }
  if (name == "100m") {
    ModelConfig c = ModelConfig::Tiny(32000);
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    c.max_position_embeddings = 2048;
    return c;
  }
  // The 2-layer tiny model that docs/benchmarks.md measured (the built-in
  // one has 3 layers since 2026-11-23).
  ModelConfig c = ModelConfig::Tiny(512);
  c.num_hidden_layers = 2;
  return c;
}

// Matmul FLOPs of one training step (forward + backward = 3x forward) on
// `batch` sequences of `seq` tokens whose last `response` tokens are scored:
// projections 2 * tokens * params, attention scores and values
// 2 * 2 * seq^2 * heads * head_dim per layer and sequence (full square, as
// computed), the output projection only for scored tokens.
inline double TrainStepFlops(const ModelConfig& c, int64_t batch, int64_t seq, int64_t response) {
  const double h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
               kv = c.num_key_value_heads * c.head_dim, ff = c.intermediate_size;
  const double layer_params = h * q + 2 * h * kv + q * h + 3 * h * ff;
  const double tokens = static_cast<double>(batch * seq);
  const double forward = 2 * tokens * layer_params * c.num_hidden_layers +
                         4.0 * batch * seq * seq * q * c.num_hidden_layers +
                         2.0 * batch * response * h * c.vocab_size;
  return 3 * forward;
}

}  // namespace asympo::bench
