// Batched token sampling on the logits' device (CPU or GPU), with per-row
// temperature, top-k, top-p and seed.
//
// Randomness is counter-based: row i's uniform for response token s is a
// hash of (seed_i, s) computed with integer tensor ops, so a request's
// tokens depend only on its own seed and logits: not on the batch it shares,
// the device, or the order of kernels. No generator state is kept, nothing
// is copied to the host, and one step is a fixed sequence of kernels (a CUDA
// graph can capture it).
//
// A row draws its token by inverting the cumulative distribution of the
// temperature-scaled softmax, after top-k (ties with the k-th logit kept)
// and top-p (the most likely tokens until their mass reaches top_p, at least
// one): exactly the categorical distribution Hugging Face's and the field's
// samplers draw from. Temperature 0 is greedy (argmax).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace asympo::rollout {

struct SamplingParams;

// uniform[i] in [0, 1) for (seeds[i], step), float64, on seeds' device.
//   seeds: (B,) int64 (any 64-bit value, reinterpreted as unsigned)
//   step:  a 0-dimensional or (1,) int64 tensor on the same device
at::Tensor CounterUniform(const at::Tensor& seeds, const at::Tensor& step);

class BatchSampler {
 public:
  // One row per entry of `params`, tensors on `device`.
  BatchSampler(const std::vector<const SamplingParams*>& params, c10::Device device);

  // Tokens (B,) int64 for logits (B, V) of any floating dtype, for response
  // token `step` (a (1,) int64 tensor on the device).
  at::Tensor Sample(const at::Tensor& logits, const at::Tensor& step) const;

  // Whether any row needs the sorted path (top-k or top-p).
  bool sorts() const { return sorts_; }

 private:
  at::Tensor seeds_;        // (B,) int64
  at::Tensor temperature_;  // (B, 1) float32; 1 on greedy rows
  at::Tensor greedy_;       // (B,) bool
  at::Tensor top_k_;        // (B, 1) int64; 0: off
  at::Tensor top_p_;        // (B, 1) float32
  bool any_greedy_ = false;
  bool all_greedy_ = false;
  bool sorts_ = false;
};

}  // namespace asympo::rollout
