#include "common/model/policy_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/version.h>
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/activation_checkpoint.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Inverse frequencies (head_dim / 2,), with the configured rope scaling.
at::Tensor InverseFrequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> f(half);
  for (int64_t i = 0; i < half; ++i) {
    f[i] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    for (double& x : f) x /= s.factor;
  } else if (s.type == "llama3") {
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    for (double& x : f) {
      const double wavelen = 2 * kPi / x;
      if (wavelen < high_wavelen) continue;  // high frequencies: unchanged
      if (wavelen > low_wavelen) {
        x /= s.factor;  // low frequencies: scaled
      } else {
        const double smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        x = (1 - smooth) * x / s.factor + smooth * x;
      }
    }
  }
  at::Tensor out = at::empty({half}, at::kDouble);
  std::copy(f.begin(), f.end(), out.data_ptr<double>());
  return out.to(at::kFloat);
}

// Replaces `params`' values from `source` (PolicyModel::LoadParameters).
absl::Status LoadNamed(std::vector<std::pair<std::string, at::Tensor>>& params,
                       const std::vector<std::pair<std::string, at::Tensor>>& source, bool tied) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : source) by_name[name] = &t;
  std::vector<std::string> missing, mis_shaped;
  for (const auto& [name, t] : params) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name);
    } else if (it->second->sizes() != t.sizes()) {
      mis_shaped.push_back(absl::StrCat(name, " (expected [", absl::StrJoin(t.sizes(), ", "),
                                        "], got [", absl::StrJoin(it->second->sizes(), ", "),
                                        "])"));
    }
    by_name.erase(name);
  }
  // A tied model may be given a redundant lm_head equal to the embeddings.
  if (tied) by_name.erase("lm_head.weight");
  const auto list = [](const std::vector<std::string>& v) {
    const size_t shown = std::min<size_t>(v.size(), 5);
    std::string s = absl::StrJoin(v.begin(), v.begin() + static_cast<ptrdiff_t>(shown), ", ");
    if (v.size() > shown) absl::StrAppend(&s, ", ... (", v.size(), " in all)");
    return s;
  };
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("missing tensors: ", list(missing)));
  }
  if (!mis_shaped.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("mis-shaped tensors: ", list(mis_shaped)));
  }
  if (!by_name.empty()) {
    std::vector<std::string> extra;
    for (const auto& [name, t] : by_name) extra.push_back(name);
    return absl::InvalidArgumentError(absl::StrCat("unexpected tensors: ", list(extra)));
  }
  return GuardTorch("loading parameters", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    std::map<std::string, const at::Tensor*> all;
    for (const auto& [name, t] : source) all[name] = &t;
    // Converted first (dtype, device), so that a failure changes nothing.
    std::vector<at::Tensor> converted;
    converted.reserve(params.size());
    for (const auto& [name, t] : params) {
      converted.push_back(all.at(name)->to(t.device(), t.scalar_type()));
    }
    for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(converted[i]);
    return absl::OkStatus();
  });
}

}  // namespace

// RMSNorm computed in float32, as Hugging Face does, then cast back.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

absl::StatusOr<int64_t> ParseActivationCheckpointing(absl::string_view text) {
  if (text == "none") return 0;
  if (text == "layers") return 1;
  int64_t every = 0;
  if (absl::ConsumePrefix(&text, "every_") && absl::SimpleAtoi(text, &every) && every >= 1) {
    return every;
  }
  return absl::InvalidArgumentError(absl::StrCat("activation checkpointing \"", text,
                                                 "\": expected none, layers or every_N (N >= 1)"));
}

std::string ActivationCheckpointingName(int64_t checkpoint_every) {
  if (checkpoint_every <= 0) return "none";
  if (checkpoint_every == 1) return "layers";
  return absl::StrCat("every_", checkpoint_every);
}

PolicyModel::PolicyModel(ModelConfig config, ModelOptions options)
    : config_(std::move(config)),
      options_(options),
      compute_dtype_(options.compute_dtype == at::ScalarType::Undefined ? options.dtype
                                                                        : options.compute_dtype) {}

at::Tensor PolicyModel::ComputeWeight(const at::Tensor& weight) const {
  if (!weight.defined() || weight.scalar_type() == compute_dtype_) return weight;
  return weight.to(compute_dtype_);
}

at::Tensor PolicyModel::AddWeight(const std::string& name, at::Tensor t) {
  if (options_.lora.enabled()) {
    t = t.to(options_.device, compute_dtype_);
  } else {
    t = t.to(options_.device, options_.dtype).set_requires_grad(true);
    params_.emplace_back(name, t);
  }
  weights_.emplace_back(name, t);
  return t;
}

absl::StatusOr<std::unique_ptr<PolicyModel>> PolicyModel::CreateRandom(
    const ModelConfig& config, const ModelOptions& options) {
  // Allocating a large model can fail (out of memory).
  return GuardTorch("building the model", [&] { return CreateRandomUnguarded(config, options); });
}

absl::StatusOr<std::unique_ptr<PolicyModel>> PolicyModel::CreateRandomUnguarded(
    const ModelConfig& config, const ModelOptions& options) {
  ASYMPO_RETURN_IF_ERROR(config.Validate());
  const auto floating = [](at::ScalarType t) {
    return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
  };
  if (!floating(options.dtype)) {
    return absl::InvalidArgumentError("model dtype must be float32, bfloat16 or float16");
  }
  if (options.compute_dtype != at::ScalarType::Undefined && !floating(options.compute_dtype)) {
    return absl::InvalidArgumentError("compute dtype must be float32, bfloat16 or float16");
  }
  ASYMPO_RETURN_IF_ERROR(ValidateLoraOptions(options.lora));
  std::unique_ptr<PolicyModel> m(new PolicyModel(config, options));
  at::Generator gen = at::detail::createCPUGenerator(options.seed);
  const double std = options.init_std;
  auto normal = [&](std::vector<int64_t> shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    return options.random_init ? t.normal_(0.0, std, gen) : t;
  };
  const ModelConfig& c = config;
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, ff = c.intermediate_size;
  const std::string p = "model.";
  m->embed_ = m->AddWeight(p + "embed_tokens.weight", normal({c.vocab_size, h}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = absl::StrCat(p, "layers.", i, ".");
    Layer layer;
    layer.input_norm = m->AddWeight(l + "input_layernorm.weight", at::ones({h}));
    layer.q_proj = m->AddWeight(l + "self_attn.q_proj.weight", normal({q, h}));
    layer.k_proj = m->AddWeight(l + "self_attn.k_proj.weight", normal({kv, h}));
    layer.v_proj = m->AddWeight(l + "self_attn.v_proj.weight", normal({kv, h}));
    if (c.attention_bias) {
      layer.q_bias = m->AddWeight(l + "self_attn.q_proj.bias", at::zeros({q}));
      layer.k_bias = m->AddWeight(l + "self_attn.k_proj.bias", at::zeros({kv}));
      layer.v_bias = m->AddWeight(l + "self_attn.v_proj.bias", at::zeros({kv}));
    }
    layer.o_proj = m->AddWeight(l + "self_attn.o_proj.weight", normal({h, q}));
    if (c.qk_norm) {
      layer.q_norm = m->AddWeight(l + "self_attn.q_norm.weight", at::ones({c.head_dim}));
      layer.k_norm = m->AddWeight(l + "self_attn.k_norm.weight", at::ones({c.head_dim}));
    }
    layer.post_norm = m->AddWeight(l + "post_attention_layernorm.weight", at::ones({h}));
    layer.gate_proj = m->AddWeight(l + "mlp.gate_proj.weight", normal({ff, h}));
    layer.up_proj = m->AddWeight(l + "mlp.up_proj.weight", normal({ff, h}));
    layer.down_proj = m->AddWeight(l + "mlp.down_proj.weight", normal({h, ff}));
    m->layers_.push_back(layer);
  }
  m->final_norm_ = m->AddWeight(p + "norm.weight", at::ones({h}));
  m->lm_head_ =
      c.tie_word_embeddings ? m->embed_ : m->AddWeight("lm_head.weight", normal({c.vocab_size, h}));
  if (options.lora.enabled()) m->AddAdapters();
  m->inv_freq_ = InverseFrequencies(c).to(options.device);
  return m;
}

std::vector<at::Tensor> PolicyModel::parameters() const {
  std::vector<at::Tensor> out;
  out.reserve(params_.size());
  for (const auto& [name, t] : params_) out.push_back(t);
  return out;
}

absl::Status PolicyModel::LoadParameters(
    const std::vector<std::pair<std::string, at::Tensor>>& source) {
  return LoadNamed(params_, source, config_.tie_word_embeddings && !has_adapters());
}

absl::Status PolicyModel::LoadWeights(
    const std::vector<std::pair<std::string, at::Tensor>>& source) {
  return LoadNamed(weights_, source, config_.tie_word_embeddings);
}

KvCache PolicyModel::NewCache(int64_t batch, int64_t capacity) const {
  KvCache cache;
  const auto opts = at::TensorOptions().dtype(compute_dtype_).device(options_.device);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.keys.push_back(
        at::zeros({batch, config_.num_key_value_heads, capacity, config_.head_dim}, opts));
    cache.values.push_back(at::zeros_like(cache.keys.back()));
  }
  return cache;
}

at::Tensor PolicyModel::Forward(const at::Tensor& ids, const at::Tensor& positions,
                                const at::Tensor& key_mask, KvCache* cache,
                                const at::Tensor& segments) const {
  const int64_t t = ids.size(1);
  const int64_t past = cache != nullptr ? cache->length : 0;
  TORCH_CHECK(cache == nullptr || past + t <= cache->capacity(), "KV cache capacity ",
              cache == nullptr ? 0 : cache->capacity(), " exceeded");
  TORCH_CHECK(key_mask.size(1) == past + t, "key_mask must cover ", past + t, " positions");
  // allowed: (B, T, P + T) = key is real and not in the future; a query
  // always sees itself so that padded rows stay finite.
  const auto dev = ids.device();
  const at::Tensor qslot =
      at::arange(past, past + t, at::TensorOptions().dtype(at::kLong).device(dev));
  const at::Tensor kslot = at::arange(past + t, at::TensorOptions().dtype(at::kLong).device(dev));
  const at::Tensor causal = kslot.unsqueeze(0) <= qslot.unsqueeze(1);  // (T, P+T)
  const at::Tensor self = kslot.unsqueeze(0) == qslot.unsqueeze(1);
  at::Tensor visible = at::logical_and(causal.unsqueeze(0), key_mask.to(at::kBool).unsqueeze(1));
  if (segments.defined()) {
    TORCH_CHECK(cache == nullptr && segments.sizes() == ids.sizes(),
                "segments must be (B, T) like ids, without a cache");
    // Block-diagonal: a query sees only its own sequence's keys.
    visible = at::logical_and(visible, segments.unsqueeze(2) == segments.unsqueeze(1));
  }
  const at::Tensor allowed = AttentionBias(at::logical_or(visible, self.unsqueeze(0)));
  // Captures by value: a checkpointed layer runs it again in the backward.
  at::Tensor hidden =
      Layers(ids, positions,
             [this, allowed, cache](int64_t i, const at::Tensor& q, at::Tensor k, at::Tensor v) {
               std::tie(k, v) = CachedKeysValues(i, k, v, allowed.size(-1), cache, at::Tensor());
               return MaskedAttention(q, k, v, allowed);
             });
  if (cache != nullptr) cache->length += t;
  return hidden;
}

at::Tensor PolicyModel::DecodeStep(const at::Tensor& ids, const at::Tensor& positions,
                                   const at::Tensor& slot, const at::Tensor& key_mask,
                                   KvCache* cache, int64_t visible) const {
  TORCH_CHECK(cache != nullptr && key_mask.size(1) == cache->capacity(),
              "DecodeStep needs a cache and a key_mask over its whole capacity");
  if (visible < 0) visible = cache->capacity();
  TORCH_CHECK(visible <= cache->capacity(), "visible ", visible, " exceeds the cache capacity");
  // allowed: (B, 1, visible): the real keys, and the query's own slot.
  const at::Tensor kslot =
      at::arange(visible, at::TensorOptions().dtype(at::kLong).device(key_mask.device()));
  const at::Tensor allowed_bool = at::logical_or(key_mask.narrow(1, 0, visible).to(at::kBool),
                                                 kslot.unsqueeze(0) == slot.reshape({1, 1}))
                                      .unsqueeze(1);
  const at::Tensor allowed = AttentionBias(allowed_bool);
  return Layers(ids, positions, [&](int64_t i, const at::Tensor& q, at::Tensor k, at::Tensor v) {
    std::tie(k, v) = CachedKeysValues(i, k, v, visible, cache, slot.reshape({1}));
    return MaskedAttention(q, k, v, allowed);
  });
}

at::Tensor PolicyModel::DecodeShared(const at::Tensor& ids, const at::Tensor& positions,
                                     const at::Tensor& prompt, const at::Tensor& prompt_length,
                                     const at::Tensor& response_slot, SharedPrefixCache* cache,
                                     int64_t prompt_visible, int64_t response_visible) const {
  TORCH_CHECK(cache != nullptr && !cache->prompts.keys.empty() && !cache->responses.keys.empty(),
              "DecodeShared needs a cache with prompts and responses");
  const int64_t s = ids.size(0), d = config_.head_dim, nkv = config_.num_key_value_heads;
  int64_t pc = cache->prompts.capacity(), rc = cache->responses.capacity();
  TORCH_CHECK(prompt_visible <= pc && response_visible <= rc, "DecodeShared: visible slots (",
              prompt_visible, ", ", response_visible, ") beyond the capacities (", pc, ", ", rc,
              ")");
  if (prompt_visible > 0) pc = prompt_visible;
  if (response_visible > 0) rc = response_visible;
  TORCH_CHECK(cache->responses.keys[0].size(0) == s, "DecodeShared: ", s,
              " sequences but the cache has room for ", cache->responses.keys[0].size(0));
  const auto longs = at::TensorOptions().dtype(at::kLong).device(ids.device());
  // Additive biases (S, 1, 1, K): a sequence sees its prompt's real tokens
  // and its response up to and including the new token's slot.
  const auto bias = [&](const at::Tensor& allowed_bool) {
    return at::zeros(allowed_bool.sizes(),
                     at::TensorOptions().dtype(compute_dtype_).device(ids.device()))
        .masked_fill_(allowed_bool.logical_not(), -std::numeric_limits<float>::infinity())
        .view({s, 1, 1, allowed_bool.size(1)});
  };
  SharedStep step;
  step.cache = cache;
  step.prompt_visible = pc;
  step.response_visible = rc;
  step.prompt = prompt;
  step.write = response_slot.view({s, 1, 1, 1}).expand({s, nkv, 1, d});
  step.prompt_bias = bias(at::arange(pc, longs).unsqueeze(0) < prompt_length.unsqueeze(1));
  step.response_bias = bias(at::arange(rc, longs).unsqueeze(0) <= response_slot.unsqueeze(1));
  return Layers(ids, positions,
                [&](int64_t i, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                  return SharedAttention(i, q, k, v, step);
                });
}

at::Tensor PolicyModel::ExtendShared(const at::Tensor& ids, const at::Tensor& positions,
                                     int64_t prompt, int64_t prompt_length, int64_t sequence,
                                     int64_t start, SharedPrefixCache* cache) const {
  TORCH_CHECK(cache != nullptr && !cache->prompts.keys.empty() && !cache->responses.keys.empty(),
              "ExtendShared needs a cache with prompts and responses");
  const int64_t t = ids.size(1);
  TORCH_CHECK(ids.size(0) == 1 && start >= 0 && start + t <= cache->responses.capacity() &&
                  prompt_length <= cache->prompts.capacity(),
              "ExtendShared: ", t, " tokens at response slot ", start, " beyond the capacity ",
              cache->responses.capacity());
  const auto bools = at::TensorOptions().dtype(at::kBool).device(ids.device());
  // (1, T, prompt + start + T): every prompt token, the response so far and
  // the new tokens causally.
  const at::Tensor allowed = at::cat(
      {at::ones({1, t, prompt_length + start}, bools), at::ones({t, t}, bools).tril().unsqueeze(0)},
      2);
  const at::Tensor bias = AttentionBias(allowed);
  return Layers(
      ids, positions,
      [&](int64_t i, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        const size_t l = static_cast<size_t>(i);
        at::Tensor rk = cache->responses.keys[l].narrow(0, sequence, 1);
        at::Tensor rv = cache->responses.values[l].narrow(0, sequence, 1);
        rk.narrow(2, start, t).copy_(k);
        rv.narrow(2, start, t).copy_(v);
        const auto prompt_part = [&](const at::Tensor& c) {
          return c.narrow(0, prompt, 1).narrow(2, 0, prompt_length);
        };
        return MaskedAttention(
            q, at::cat({prompt_part(cache->prompts.keys[l]), rk.narrow(2, 0, start + t)}, 2),
            at::cat({prompt_part(cache->prompts.values[l]), rv.narrow(2, 0, start + t)}, 2), bias);
      });
}

SharedPrefixCache PolicyModel::NewSharedCache(int64_t prompts, int64_t prompt_capacity,
                                              int64_t sequences, int64_t response_capacity) const {
  return {NewCache(prompts, prompt_capacity), NewCache(sequences, response_capacity)};
}

KvCache PromptRow(const SharedPrefixCache& cache, int64_t row) {
  KvCache view;
  for (size_t i = 0; i < cache.prompts.keys.size(); ++i) {
    view.keys.push_back(cache.prompts.keys[i].narrow(0, row, 1));
    view.values.push_back(cache.prompts.values[i].narrow(0, row, 1));
  }
  return view;
}

std::vector<at::Tensor> PolicyModel::LayerParameters(int64_t layer) const {
  const Layer& l = layers_[static_cast<size_t>(layer)];
  std::vector<at::Tensor> out;
  if (has_adapters()) {
    for (const LoraAdapter& a : l.lora) {
      if (a.defined()) out.insert(out.end(), {a.a, a.b});
    }
    return out;
  }
  for (const at::Tensor* t :
       {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_bias, &l.k_bias, &l.v_bias,
        &l.q_norm, &l.k_norm, &l.post_norm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
    if (t->defined()) out.push_back(*t);
  }
  return out;
}

at::Tensor PolicyModel::DecoderLayer(int64_t index, const at::Tensor& x, const at::Tensor& cos,
                                     const at::Tensor& sin, const Attend& attend) const {
  const Layer& layer = layers_[static_cast<size_t>(index)];
  const auto w = [this](const at::Tensor& t) { return ComputeWeight(t); };
  const at::Tensor h =
      x + Attention(layer, index, RmsNorm(x, w(layer.input_norm), config_.rms_norm_eps), cos, sin,
                    attend);
  const at::Tensor hn = RmsNorm(h, w(layer.post_norm), config_.rms_norm_eps);
  const at::Tensor gate = Project(layer, LoraTarget::kGate, hn, layer.gate_proj);
  const at::Tensor up = Project(layer, LoraTarget::kUp, hn, layer.up_proj);
  return h + Project(layer, LoraTarget::kDown, at::silu(gate) * up, layer.down_proj);
}

at::Tensor PolicyModel::Layers(const at::Tensor& ids, const at::Tensor& positions,
                               const Attend& attend) const {
  const auto [cos, sin] = Rotary(positions);
  const auto w = [this](const at::Tensor& t) { return ComputeWeight(t); };
  // Rows are gathered from the (float32 master) table before the cast.
  at::Tensor x = at::embedding(embed_, ids).to(compute_dtype_);
  const int64_t every = options_.checkpoint_every;
  const bool checkpointing = every > 0 && at::GradMode::is_enabled();
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    if (residency_ != nullptr || (checkpointing && i % every == 0)) {
      // The layer's forward, owning what it reads (the backward runs it).
      auto run = [this, i, cos = cos, sin = sin, attend](const at::Tensor& in) {
        return DecoderLayer(i, in, cos, sin, attend);
      };
      std::shared_ptr<const CallResidency> residency;
      if (LayerResidency* r = residency_; r != nullptr) {
        residency = std::make_shared<const CallResidency>(CallResidency{
            [r, i] { r->Gather(i); }, [r, i] { r->Release(i); },
            [r, i](const std::vector<at::Tensor>& grads) { r->ReduceGradients(i, grads); }});
      }
      x = CheckpointedCall(std::move(run), x, LayerParameters(i), std::move(residency));
    } else {
      x = DecoderLayer(i, x, cos, sin, attend);
    }
  }
  return RmsNorm(x, w(final_norm_), config_.rms_norm_eps);
}

at::Tensor PolicyModel::Logits(const at::Tensor& hidden) const {
  return at::linear(hidden, ComputeWeight(lm_head_));
}

}  // namespace asympo
