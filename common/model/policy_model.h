// The policy: a decoder-only transformer matching Hugging Face Llama and
// Qwen3 (RMSNorm, rotary embeddings with rope_theta and Llama-3 scaling,
// grouped-query attention, SwiGLU MLP, Qwen3's per-head q/k RMSNorm, tied
// embeddings), built from a ModelConfig.
//
// Parameters use the checkpoint's names ("model.layers.0.self_attn.q_proj.
// weight", ...) so that safetensors files load and export one to one.
// Forward passes are const and may run concurrently; changing parameters
// (an optimizer step, loading weights) must be serialized by the caller.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/lora.h"
#include "common/model/model_config.h"

namespace asympo {

struct ModelOptions {
  // Parameter dtype: float32 (CPU default) or bfloat16 where supported.
  at::ScalarType dtype = at::kFloat;
  // The dtype of activations and matmuls. Undefined: the parameter dtype.
  // Mixed precision (the learner on a GPU): float32 parameters (the master
  // weights the optimizer updates) with bfloat16 compute; each forward casts
  // the weights it uses, and the casts' backward accumulates float32
  // gradients. RMSNorm statistics and the rotary angles stay in float32.
  at::ScalarType compute_dtype = at::ScalarType::Undefined;
  at::Device device = at::kCPU;
  // Random initialization: N(0, init_std) for matrices, 1 for norms.
  uint64_t seed = 0;
  double init_std = 0.02;
  // False leaves parameters uninitialized (for loading a checkpoint next).
  bool random_init = true;
  // Activation checkpointing while gradients are recorded: every
  // checkpoint_every-th decoder layer (layers 0, N, 2N, ...; 1: every
  // layer) keeps only its input for the backward, which runs its forward
  // again to get the rest. 0: none. Without gradient recording (inference)
  // it has no effect.
  int64_t checkpoint_every = 0;
  // Low-rank adapters (common/model/lora.h). With rank > 0 the transformer's
  // weights are frozen, held in the compute dtype without gradients, and
  // only the adapters (float32) are parameters.
  LoraOptions lora;
};

// Keys and values of past positions, per layer, for incremental decoding.
struct KvCache {
  std::vector<at::Tensor> keys;    // per layer: (B, n_kv, capacity, head_dim)
  std::vector<at::Tensor> values;  // per layer: (B, n_kv, capacity, head_dim)
  int64_t length = 0;              // positions filled so far
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].size(2); }
};

// Keys and values for continuous batching (rollout_server's
// ContinuousEngine): each prompt's once, shared by every sequence that
// continues it, and each running sequence's response in a row of its own.
struct SharedPrefixCache {
  KvCache prompts;    // per layer: (P, n_kv, prompt capacity, head_dim)
  KvCache responses;  // per layer: (S, n_kv, response capacity, head_dim)
};

// Row `row` of cache.prompts as an empty KvCache of batch 1 (views of the
// same memory): Forward with it prefills that prompt.
KvCache PromptRow(const SharedPrefixCache& cache, int64_t row);

// Where the decoder layers' weights live when they are sharded across
// data-parallel ranks (learner_server/optim/full_shard.h). The model gathers a
// layer's weights before running it and releases them after (in the
// forward, and again in the backward, which recomputes the layer), and
// hands the layer's gradients over instead of accumulating them in .grad.
// Called on the thread that runs the forward or the backward.
class LayerResidency {
 public:
  virtual ~LayerResidency() = default;
  virtual void Gather(int64_t layer) = 0;
  virtual void Release(int64_t layer) = 0;
  // grads: one per tensor of PolicyModel::LayerParameters(layer), in its
  // order (undefined where the layer did not use it).
  virtual void ReduceGradients(int64_t layer, const std::vector<at::Tensor>& grads) = 0;
};

// --activation_checkpointing: "none" (0), "layers" (1) or "every_N" (N >= 1)
// as ModelOptions::checkpoint_every; INVALID_ARGUMENT names the value.
absl::StatusOr<int64_t> ParseActivationCheckpointing(absl::string_view text);
// The flag's spelling of checkpoint_every (the inverse of the above).
std::string ActivationCheckpointingName(int64_t checkpoint_every);

// RMSNorm of x's last dimension, computed in float32 as Hugging Face does,
// then cast back to x's dtype.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The additive attention bias (B, 1, T, K) in `dtype` (0 where `allowed`
// (B, T, K, bool) holds, -inf elsewhere) that scaled_dot_product_attention
// would make from the boolean mask at every call, made once: a forward's
// layers share it (and their backwards keep the one tensor). Its rows lie
// kAttentionBiasAlignment keys apart (a view of a padded buffer), the
// alignment the memory-efficient kernel needs, so that SDPA need not copy
// it padded per layer.
inline constexpr int64_t kAttentionBiasAlignment = 16;
at::Tensor AlignedAttentionBias(const at::Tensor& allowed, at::ScalarType dtype);

class PolicyModel {
 public:
  // A randomly initialized model (deterministic for a given seed), or an
  // uninitialized one when options.random_init is false. A LibTorch error
  // (such as out of memory) is a status.
  static absl::StatusOr<std::unique_ptr<PolicyModel>> CreateRandom(const ModelConfig& config,
                                                                   const ModelOptions& options);

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // options().compute_dtype, or the parameter dtype where that is undefined.
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // `weight` in the compute dtype (itself when it already is; otherwise a
  // differentiable cast).
  at::Tensor ComputeWeight(const at::Tensor& weight) const;

  // Every trainable tensor with its name, in a fixed order: the
  // transformer's weights (named_weights()), or with adapters the adapters
  // alone ("model.layers.0.self_attn.q_proj.lora_A.weight", ...: A then B
  // of each targeted projection, layer by layer).
  const std::vector<std::pair<std::string, at::Tensor>>& named_parameters() const {
    return params_;
  }
  std::vector<at::Tensor> parameters() const;
  // The transformer's weights with their checkpoint names, in a fixed order
  // (the same tensors as named_parameters() without adapters; frozen with
  // them). With tied embeddings "lm_head.weight" is absent (it is
  // embed_tokens).
  const std::vector<std::pair<std::string, at::Tensor>>& named_weights() const { return weights_; }
  bool has_adapters() const { return options_.lora.enabled(); }
  // named_weights() with the adapters merged in (W + alpha / rank * B A),
  // detached: what a model without adapters would hold. Without adapters,
  // the weights themselves (detached).
  std::vector<std::pair<std::string, at::Tensor>> MergedWeights() const;
  // The (V, H) output projection (embed_tokens when tied).
  const at::Tensor& lm_head_weight() const { return lm_head_; }
  // Decoder layer `layer`'s parameters (a subset of parameters(): its
  // adapters when there are adapters), in a fixed order.
  std::vector<at::Tensor> LayerParameters(int64_t layer) const;

  // Fully sharded training: from now on every decoder layer runs between
  // residency->Gather and Release, recomputed in the backward, with its
  // gradients handed to residency->ReduceGradients. Null: the weights are
  // whole (the default). Not thread-safe; `residency` must outlive its use.
  void set_layer_residency(LayerResidency* residency) { residency_ = residency; }

  // Replaces every parameter's values from `source` (name -> tensor), which
  // must hold exactly the model's names with matching shapes; converted to
  // the model's dtype and device. Errors name missing, extra or mis-shaped
  // tensors; on error nothing is changed.
  absl::Status LoadParameters(const std::vector<std::pair<std::string, at::Tensor>>& source);
  // The same for named_weights() (the frozen base, with adapters).
  absl::Status LoadWeights(const std::vector<std::pair<std::string, at::Tensor>>& source);

  // Runs the transformer and returns the final-normed hidden states
  // (B, T, H), in the compute dtype.
  //   ids:       (B, T) int64 token ids.
  //   positions: (B, T) int64 rotary positions of those tokens.
  //   key_mask:  (B, P + T) bool, true where a key is a real token (false on
  //              padding), P = cache->length (0 without a cache). A query
  //              attends to real keys at or before its own slot.
  //   cache:     when non-null, keys/values of the T new tokens are written
  //              at slots [P, P + T) and cache->length advances by T.
  //   segments:  packed sequences (no cache): (B, T) int64, the sequence
  //              each token belongs to; a query attends only to keys of its
  //              own segment (a block-diagonal causal mask). Positions
  //              restart with each sequence. Undefined: one sequence a row.
  at::Tensor Forward(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& key_mask,
                     KvCache* cache = nullptr, const at::Tensor& segments = at::Tensor()) const;

  // One decode step with static shapes (CUDA-graph friendly): the keys and
  // values of `ids` go to cache slot `slot` and attention spans the whole
  // cache capacity; cache->length is not used or changed.
  //   ids, positions: (B, 1) int64.
  //   slot:           (1,) int64 on the device, the cache slot to write.
  //   key_mask:       (B, capacity) bool, true where a slot holds a real key
  //                   the new token may see (the new slot itself is always
  //                   visible).
  //   visible:        attend over the first `visible` slots only (they must
  //                   include `slot`); -1: the whole capacity (static shapes,
  //                   for CUDA graphs). Eager decoding passes the filled part.
  at::Tensor DecodeStep(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& slot,
                        const at::Tensor& key_mask, KvCache* cache, int64_t visible = -1) const;

  // One decode step of S sequences that continue prompts stored once in
  // cache->prompts, with static shapes (CUDA-graph friendly); returns the
  // hidden states (S, 1, H). Every tensor is on the model's device:
  //   ids, positions: (S, 1) int64: each sequence's newest token and its
  //                   rotary position.
  //   prompt:         (S,) int64: the row of cache->prompts it continues.
  //   prompt_length:  (S,) int64: that prompt's tokens (the first slots of
  //                   its row).
  //   response_slot:  (S,) int64: the new token's slot in the sequence's own
  //                   row of cache->responses; the slots before it hold its
  //                   earlier response tokens and are attended to.
  // The new keys and values are written at response_slot. A row that is not
  // in use may hold anything (prompt_length 0 keeps it finite).
  // prompt_visible, response_visible: attend over the first slots of the
  // two regions only (they must cover every prompt_length and
  // response_slot + 1); -1: the whole capacities (static shapes, for CUDA
  // graphs). Eager decoding passes the filled parts.
  at::Tensor DecodeShared(const at::Tensor& ids, const at::Tensor& positions,
                          const at::Tensor& prompt, const at::Tensor& prompt_length,
                          const at::Tensor& response_slot, SharedPrefixCache* cache,
                          int64_t prompt_visible = -1, int64_t response_visible = -1) const;

  // Appends T tokens to one sequence of a SharedPrefixCache (a multi-turn
  // sequence taking an environment's tokens), returning their hidden states
  // (1, T, H):
  //   ids, positions: (1, T) int64 on the model's device.
  //   prompt, prompt_length: the row of cache->prompts the sequence
  //                   continues and its tokens.
  //   sequence, start: the sequence's row of cache->responses; the new keys
  //                   and values go to its slots [start, start + T), and
  //                   each new token attends to the prompt, the slots
  //                   before `start` and the new tokens up to itself.
  at::Tensor ExtendShared(const at::Tensor& ids, const at::Tensor& positions, int64_t prompt,
                          int64_t prompt_length, int64_t sequence, int64_t start,
                          SharedPrefixCache* cache) const;

  // (B, T, V) logits, in the compute dtype, from hidden states (B, T, H).
  at::Tensor Logits(const at::Tensor& hidden) const;

  // An empty cache for `batch` sequences of up to `capacity` positions.
  KvCache NewCache(int64_t batch, int64_t capacity) const;
  // An empty SharedPrefixCache: `prompts` rows of `prompt_capacity`
  // positions, `sequences` rows of `response_capacity`.
  SharedPrefixCache NewSharedCache(int64_t prompts, int64_t prompt_capacity, int64_t sequences,
                                   int64_t response_capacity) const;

 private:
  struct Layer {
    at::Tensor input_norm, q_proj, k_proj, v_proj, o_proj;
    at::Tensor q_bias, k_bias, v_bias;  // undefined without attention_bias
    at::Tensor q_norm, k_norm;          // undefined without qk_norm
    at::Tensor post_norm, gate_proj, up_proj, down_proj;
    std::array<LoraAdapter, kLoraTargetCount> lora;  // undefined where not targeted
  };

  PolicyModel(ModelConfig config, ModelOptions options);
  static absl::StatusOr<std::unique_ptr<PolicyModel>> CreateRandomUnguarded(
      const ModelConfig& config, const ModelOptions& options);
  // A transformer weight: a parameter, or frozen in the compute dtype with
  // adapters.
  at::Tensor AddWeight(const std::string& name, at::Tensor t);
  // With adapters: each decoder layer's (lora.cc), after the weights.
  void AddAdapters();
  // weight's projection `target` of `layer` on x, its adapter included.
  at::Tensor Project(const Layer& layer, LoraTarget target, const at::Tensor& x,
                     const at::Tensor& weight, const at::Tensor& bias = at::Tensor()) const;
  // cos and signed sin (first half negated): (B, T, 1, head_dim) float32.
  std::pair<at::Tensor, at::Tensor> Rotary(const at::Tensor& positions) const;
  // A layer's attention over its keys and values, given the rotated queries
  // q (B, T, nh, d) and the new keys and values k, v (B, nkv, T, d): the
  // heads' outputs (B, T, nh * d), before the output projection.
  using Attend = std::function<at::Tensor(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v)>;
  // DecodeShared's per-step tensors (see there).
  struct SharedStep {
    SharedPrefixCache* cache = nullptr;
    int64_t prompt_visible = 0, response_visible = 0;  // slots attended to
    at::Tensor prompt;                                 // (S,)
    at::Tensor write;                                  // (S, nkv, 1, d): response_slot, expanded
    at::Tensor prompt_bias;                            // (S, 1, 1, prompt capacity): 0 or -inf
    at::Tensor response_bias;                          // (S, 1, 1, response capacity)
  };

  // Layer `index`'s attention block on x (B, T, H), output-projected.
  at::Tensor Attention(const Layer& layer, int64_t index, const at::Tensor& x,
                       const at::Tensor& cos, const at::Tensor& sin, const Attend& attend) const;
  // Attention over one key set with `allowed` (AttentionBias's form).
  at::Tensor MaskedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& allowed) const;
  // Attention of one query position over its prompt's keys and its own
  // response's (DecodeShared).
  at::Tensor SharedAttention(int64_t index, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const SharedStep& step) const;
  // Layer `index`'s keys and values to attend over, (B, nkv, K, d), after
  // storing the new ones (k, v: (B, nkv, T, d)) in `cache` (at `slot`, or at
  // cache->length); without a cache, k and v themselves.
  std::pair<at::Tensor, at::Tensor> CachedKeysValues(int64_t index, const at::Tensor& k,
                                                     const at::Tensor& v, int64_t visible,
                                                     KvCache* cache, const at::Tensor& slot) const;
  // The attention mask in the form MaskedAttention takes, from allowed (B, T, K)
  // bool.
  at::Tensor AttentionBias(const at::Tensor& allowed_bool) const;
  // Decoder layer `index` on x (B, T, H).
  at::Tensor DecoderLayer(int64_t index, const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin, const Attend& attend) const;
  // Embedding, the decoder layers and the final norm. `attend` must own
  // what it captures when activation checkpointing may keep it for the
  // backward.
  at::Tensor Layers(const at::Tensor& ids, const at::Tensor& positions, const Attend& attend) const;

  ModelConfig config_;
  ModelOptions options_;
  at::ScalarType compute_dtype_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<std::pair<std::string, at::Tensor>> weights_;
  at::Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  at::Tensor inv_freq_;  // (head_dim / 2) float32
  LayerResidency* residency_ = nullptr;
};

}  // namespace asympo
