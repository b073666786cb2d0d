// PolicyModel's attention (policy_model.h): rotary embeddings, the KV
// caches' keys and values, masked attention over a batch or packed
// sequences, and attention over a prompt cache shared by a group.
#include <limits>
#include <tuple>

#include <ATen/ATen.h>
#include "common/model/policy_model.h"

namespace asympo {
namespace {

// Rotary embedding x * cos + rotate_half(x) * sin, with HF's rotate_half
// (x1, x2) -> (-x2, x1) written as roll(x, d/2) times a sign folded into
// `signed_sin` = (-sin_1, sin_2): two kernels instead of five.
at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin) {
  return at::addcmul(x * cos, x.roll(x.size(-1) / 2, -1), signed_sin);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> PolicyModel::Rotary(const at::Tensor& positions) const {
  // freqs: (B, T, head_dim / 2); emb: (B, 1, T, head_dim)
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq_;
  const at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(2);  // (B, T, 1, d)
  // sin with the first half negated, for ApplyRotary.
  const int64_t half = freqs.size(-1);
  at::Tensor signed_sin = emb.sin();
  signed_sin.narrow(-1, 0, half).neg_();
  return {emb.cos(), signed_sin};
}

std::pair<at::Tensor, at::Tensor> PolicyModel::CachedKeysValues(int64_t index, const at::Tensor& k,
                                                                const at::Tensor& v,
                                                                int64_t visible, KvCache* cache,
                                                                const at::Tensor& slot) const {
  if (cache == nullptr) {
    // Dense (B, nkv, T, d) so that the attention GEMMs read k^T and v as
    // plain (transposed) matrices, in the forward and in the backward.
    return {k.contiguous(), v.contiguous()};
  }
  at::Tensor& keys = cache->keys[static_cast<size_t>(index)];
  at::Tensor& values = cache->values[static_cast<size_t>(index)];
  if (slot.defined()) {
    // A decode step: the slot is a device tensor; the keys span the first
    // `visible` slots (the whole capacity for static shapes; the mask hides
    // unfilled slots).
    keys.index_copy_(2, slot, k);
    values.index_copy_(2, slot, v);
    return {keys.narrow(2, 0, visible), values.narrow(2, 0, visible)};
  }
  const int64_t past = cache->length, t = k.size(2);
  keys.narrow(2, past, t).copy_(k);
  values.narrow(2, past, t).copy_(v);
  return {keys.narrow(2, 0, past + t), values.narrow(2, 0, past + t)};
}

at::Tensor PolicyModel::Attention(const Layer& layer, int64_t index, const at::Tensor& x,
                                  const at::Tensor& cos, const at::Tensor& sin,
                                  const Attend& attend) const {
  const ModelConfig& c = config_;
  const int64_t b = x.size(0), t = x.size(1), d = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  // q: (B, T, nh, d); k, v: (B, T, nkv, d). Query head h uses key head
  // h / groups (Hugging Face's repeat_kv).
  const auto w = [this](const at::Tensor& t) { return ComputeWeight(t); };
  at::Tensor q = Project(layer, LoraTarget::kQ, x, layer.q_proj, layer.q_bias).view({b, t, nh, d});
  at::Tensor k = Project(layer, LoraTarget::kK, x, layer.k_proj, layer.k_bias).view({b, t, nkv, d});
  at::Tensor v = Project(layer, LoraTarget::kV, x, layer.v_proj, layer.v_bias).view({b, t, nkv, d});
  if (c.qk_norm) {
    q = RmsNorm(q, w(layer.q_norm), c.rms_norm_eps);
    k = RmsNorm(k, w(layer.k_norm), c.rms_norm_eps);
  }
  const at::Tensor cq = cos.to(q.scalar_type()), sq = sin.to(q.scalar_type());
  q = ApplyRotary(q, cq, sq);
  k = ApplyRotary(k, cq, sq).transpose(1, 2);  // (B, nkv, T, d)
  v = v.transpose(1, 2);                       // (B, nkv, T, d)
  return Project(layer, LoraTarget::kO, attend(index, q, k, v), layer.o_proj);
}

at::Tensor PolicyModel::MaskedAttention(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& allowed) const {
  const int64_t b = q.size(0), t = q.size(1), d = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  const int64_t groups = nh / nkv;
#if TORCH_VERSION_MAJOR >= 2
  // Fused attention where LibTorch has it (2.x). `allowed`: the additive
  // bias (B, 1, T, Tk) in the compute dtype (AlignedAttentionBias).
  // Query head h reads key head h / groups; expand + reshape (no host
  // synchronisation, unlike repeat_interleave on a GPU).
  const auto repeat = [&](const at::Tensor& kv) {
    if (groups == 1) return kv;
    const int64_t tk = kv.size(2);
    return kv.unsqueeze(2).expand({b, nkv, groups, tk, d}).reshape({b, nh, tk, d});
  };
  const at::Tensor bias =
      allowed.scalar_type() == q.scalar_type() ? allowed : allowed.to(q.scalar_type());
  return at::scaled_dot_product_attention(q.transpose(1, 2), repeat(k), repeat(v), bias)
      .transpose(1, 2)
      .reshape({b, t, nh * d});
#else
  // The `groups` query heads of a key head and the T positions form one
  // matrix, so each (batch, key head) pair is one GEMM against its keys,
  // with no copy of the keys per query head:
  //   qg (B, nkv, T * groups, d) @ k^T (B, nkv, d, Tk) -> (B, nkv, T * groups, Tk)
  // The 1/sqrt(d) scale goes on q (T x d) rather than on the scores, and the
  // mask is an additive 0 / -inf bias `allowed` (B, 1, T, 1, Tk): its
  // backward passes the gradient through untouched. Score-sized passes are
  // what dominate small models.
  const int64_t tk = k.size(2);
  const at::Tensor qg = (q * (1.0 / std::sqrt(static_cast<double>(d))))
                            .view({b, t, nkv, groups, d})
                            .permute({0, 2, 1, 3, 4})
                            .reshape({b, nkv, t * groups, d});
  // Out of place: an in-place add on a view would cost a CopySlices (a
  // score-sized copy) in the backward; this add's backward is the identity.
  const at::Tensor scores =
      at::matmul(qg, k.transpose(-1, -2)).view({b, nkv, t, groups, tk}) + allowed;
  const at::Tensor probs =
      at::softmax(scores, -1, at::kFloat).to(q.scalar_type()).view({b, nkv, t * groups, tk});
  return at::matmul(probs, v)  // (B, nkv, T * groups, d)
      .view({b, nkv, t, groups, d})
      .permute({0, 2, 1, 3, 4})
      .reshape({b, t, nh * d});
#endif
}

at::Tensor PolicyModel::SharedAttention(int64_t index, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const SharedStep& step) const {
  const int64_t s = q.size(0), d = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  const size_t i = static_cast<size_t>(index);
  // This step's key and value go to each sequence's own response slot.
  at::Tensor rk = step.cache->responses.keys[i].narrow(2, 0, step.response_visible);
  at::Tensor rv = step.cache->responses.values[i].narrow(2, 0, step.response_visible);
  rk.scatter_(2, step.write, k);
  rv.scatter_(2, step.write, v);
  // The prompts' keys are read where they are stored once; a layer at a
  // time, each sequence gathers its own prompt's.
  const at::Tensor pk =
      step.cache->prompts.keys[i].narrow(2, 0, step.prompt_visible).index_select(0, step.prompt);
  const at::Tensor pv =
      step.cache->prompts.values[i].narrow(2, 0, step.prompt_visible).index_select(0, step.prompt);
  // One query position: qg (S, nkv, groups, d) against the two key sets;
  // one softmax over both, in float32.
  const at::Tensor qg =
      (q * (1.0 / std::sqrt(static_cast<double>(d)))).reshape({s, nkv, nh / nkv, d});
  const at::Tensor scores = at::cat({at::matmul(qg, pk.transpose(-1, -2)) + step.prompt_bias,
                                     at::matmul(qg, rk.transpose(-1, -2)) + step.response_bias},
                                    -1);
  const int64_t pc = pk.size(2), rc = rk.size(2);
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return (at::matmul(probs.narrow(-1, 0, pc), pv) + at::matmul(probs.narrow(-1, pc, rc), rv))
      .reshape({s, 1, nh * d});
}

at::Tensor AlignedAttentionBias(const at::Tensor& allowed, at::ScalarType dtype) {
  const int64_t b = allowed.size(0), t = allowed.size(1), keys = allowed.size(2);
  const int64_t padded =
      (keys + kAttentionBiasAlignment - 1) / kAttentionBiasAlignment * kAttentionBiasAlignment;
  at::Tensor bias = at::full({b, 1, t, padded}, -std::numeric_limits<float>::infinity(),
                             at::TensorOptions().dtype(dtype).device(allowed.device()));
  at::Tensor view = bias.narrow(-1, 0, keys);
  view.masked_fill_(allowed.unsqueeze(1), 0.0);
  return view;
}

at::Tensor PolicyModel::AttentionBias(const at::Tensor& allowed_bool) const {
#if TORCH_VERSION_MAJOR >= 2
  // SDPA would turn the boolean mask into this bias at every layer, and
  // the memory-efficient kernel keeps it for the layer's backward: one
  // (B, T, K) tensor a layer. Made once, the layers share it.
  return AlignedAttentionBias(allowed_bool, compute_dtype_);
#else
  // Additive bias (B, 1, T, 1, K): 0 where allowed, -inf elsewhere.
  const int64_t t = allowed_bool.size(1), keys = allowed_bool.size(2);
  return at::zeros(allowed_bool.sizes(),
                   at::TensorOptions().dtype(compute_dtype_).device(allowed_bool.device()))
      .masked_fill_(allowed_bool.logical_not(), -std::numeric_limits<float>::infinity())
      .view({allowed_bool.size(0), 1, t, 1, keys});
#endif
}

}  // namespace asympo
