#include "rollout_server/engine/sampling.h"

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>
#include "rollout_server/engine/generation.h"

namespace asympo::rollout {
namespace {

constexpr int64_t kLow32 = int64_t{0xffffffff};

// (x * c) mod 2^32 for x in [0, 2^32) and a 32-bit constant c, in int64
// arithmetic that never overflows (16-bit halves).
at::Tensor Mul32(const at::Tensor& x, int64_t c) {
  const at::Tensor lo = at::bitwise_and(x, 0xffff);
  const at::Tensor hi = at::__rshift__(x, 16);
  return at::bitwise_and(lo * c + at::__lshift__(at::bitwise_and(hi * c, 0xffff), 16), kLow32);
}

// MurmurHash3's 32-bit finalizer: a bijection of [0, 2^32) with full
// avalanche.
at::Tensor Fmix32(at::Tensor x) {
  x = at::bitwise_xor(x, at::__rshift__(x, 16));
  x = Mul32(x, int64_t{0x85ebca6b});
  x = at::bitwise_xor(x, at::__rshift__(x, 13));
  x = Mul32(x, int64_t{0xc2b2ae35});
  return at::bitwise_xor(x, at::__rshift__(x, 16));
}

}  // namespace

at::Tensor CounterUniform(const at::Tensor& seeds, const at::Tensor& step) {
  const at::Tensor seed_lo = at::bitwise_and(seeds, kLow32);
  // Arithmetic shift keeps the sign bits of a negative seed: mask them.
  const at::Tensor seed_hi = at::bitwise_and(at::__rshift__(seeds, 32), kLow32);
  const at::Tensor s = Mul32(at::bitwise_and(step.reshape({-1}), kLow32), int64_t{0x9e3779b9});
  const at::Tensor h = Fmix32(at::bitwise_xor(Fmix32(at::bitwise_xor(seed_lo, s)), seed_hi));
  // 53 random bits: 32 from one lane, 21 from another.
  const at::Tensor a = Fmix32(at::bitwise_xor(h, int64_t{0x1b873593}));
  const at::Tensor b = at::__rshift__(Fmix32(at::bitwise_xor(h, int64_t{0x68e31da4})), 11);
  const double scale = 1.0 / 9007199254740992.0;  // 2^-53
  return (a * (int64_t{1} << 21) + b).to(at::kDouble) * scale;
}

BatchSampler::BatchSampler(const std::vector<const SamplingParams*>& params, c10::Device device) {
  const int64_t b = static_cast<int64_t>(params.size());
  at::Tensor seeds = at::empty({b}, at::kLong), temp = at::empty({b, 1}, at::kFloat);
  at::Tensor greedy = at::empty({b}, at::kBool), top_k = at::empty({b, 1}, at::kLong);
  at::Tensor top_p = at::empty({b, 1}, at::kFloat);
  int64_t greedy_rows = 0;
  for (int64_t i = 0; i < b; ++i) {
    const SamplingParams& p = *params[static_cast<size_t>(i)];
    const bool g = p.temperature == 0;
    greedy_rows += g ? 1 : 0;
    seeds[i] = static_cast<int64_t>(p.seed);
    temp[i][0] = g ? 1.0 : p.temperature;
    greedy[i] = g;
    top_k[i][0] = static_cast<int64_t>(p.top_k);
    top_p[i][0] = p.top_p;
    sorts_ = sorts_ || (!g && (p.top_k > 0 || p.top_p < 1.0));
  }
  any_greedy_ = greedy_rows > 0;
  all_greedy_ = greedy_rows == b;
  seeds_ = seeds.to(device);
  temperature_ = temp.to(device);
  greedy_ = greedy.to(device);
  top_k_ = top_k.to(device);
  top_p_ = top_p.to(device);
}

BatchSampler::BatchSampler(int64_t rows, c10::Device device) {
  const auto on = at::TensorOptions().device(device);
  seeds_ = at::zeros({rows}, on.dtype(at::kLong));
  temperature_ = at::ones({rows, 1}, on.dtype(at::kFloat));
  greedy_ = at::ones({rows}, on.dtype(at::kBool));
  top_k_ = at::zeros({rows, 1}, on.dtype(at::kLong));
  top_p_ = at::ones({rows, 1}, on.dtype(at::kFloat));
  any_greedy_ = false;
  all_greedy_ = true;  // until a row samples
}

void BatchSampler::SetRow(int64_t row, const SamplingParams& p) {
  const bool g = p.temperature == 0;
  seeds_[row].fill_(static_cast<int64_t>(p.seed));
  temperature_[row][0].fill_(g ? 1.0 : p.temperature);
  greedy_[row].fill_(g);
  top_k_[row][0].fill_(static_cast<int64_t>(p.top_k));
  top_p_[row][0].fill_(p.top_p);
  any_greedy_ = any_greedy_ || g;
  all_greedy_ = all_greedy_ && g;
  sorts_ = sorts_ || (!g && (p.top_k > 0 || p.top_p < 1.0));
}

at::Tensor BatchSampler::Sample(const at::Tensor& logits, const at::Tensor& step) const {
  const at::Tensor argmax = any_greedy_ ? logits.argmax(1) : at::Tensor();
  if (all_greedy_) return argmax;
  const int64_t v = logits.size(1);
  at::Tensor scaled = logits.to(at::kFloat) / temperature_;  // (B, V)
  if (sorts_) {
    // Which tokens survive top-k (ties with the k-th kept) and then top-p
    // (computed on the top-k-renormalized probabilities), decided in sorted
    // order and mapped back: the draw itself is always in vocabulary order,
    // so that a row without top-k/top-p draws the same token whether or not
    // its batch sorts.
    const auto sorted_order = scaled.sort(/*dim=*/1, /*descending=*/true);
    const at::Tensor& sorted = std::get<0>(sorted_order);
    const at::Tensor& order = std::get<1>(sorted_order);
    const at::Tensor kth = sorted.gather(1, (top_k_ - 1).clamp(0, v - 1));
    const at::Tensor keep_k = at::logical_or(top_k_ <= 0, sorted >= kth);
    const at::Tensor p = at::softmax(
        sorted.masked_fill(keep_k.logical_not(), -std::numeric_limits<float>::infinity()), 1);
    const at::Tensor mass_before = p.cumsum(1) - p;
    const at::Tensor drop_p = at::logical_and(mass_before >= top_p_, top_p_ < 1.0);
    const at::Tensor keep = at::logical_and(keep_k, drop_p.logical_not());
    const at::Tensor keep_vocab = at::zeros_like(keep).scatter_(1, order, keep);
    scaled = scaled.masked_fill(keep_vocab.logical_not(), -std::numeric_limits<float>::infinity());
  }
  const at::Tensor probs = at::softmax(scaled, 1);
  const at::Tensor cdf = probs.to(at::kDouble).cumsum(1);  // (B, V)
  const at::Tensor target = (CounterUniform(seeds_, step) * cdf.select(1, v - 1)).unsqueeze(1);
  at::Tensor tokens = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
                          .clamp_max(v - 1)
                          .squeeze(1);  // (B,)
  if (any_greedy_) tokens = at::where(greedy_, argmax, tokens);
  return tokens;
}

}  // namespace asympo::rollout
