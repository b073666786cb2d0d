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

// uniform[i] in [0, 1) for (seeds[i], step[i]), float64, on seeds' device.
//   seeds: (B,) int64 (any 64-bit value, reinterpreted as unsigned)
//   step:  int64 on the same device: 0-dimensional or (1,) (one step for
//          every row) or (B,) (a step per row)
at::Tensor CounterUniform(const at::Tensor& seeds, const at::Tensor& step);

class BatchSampler {
 public:
  // One row per entry of `params`, tensors on `device`.
  BatchSampler(const std::vector<const SamplingParams*>& params, c10::Device device);
  // `rows` rows to be given their parameters by SetRow (continuous
  // batching: a row is a slot that successive requests take).
  BatchSampler(int64_t rows, c10::Device device);

  // Row `row` samples with `params` from now on. Between samples only (it
  // writes the tensors a captured step reads). May widen the kernels Sample
  // runs (see path()), never narrow them.
  void SetRow(int64_t row, const SamplingParams& params);

  // Tokens (B,) int64 for logits (B, V) of any floating dtype, for response
  // token `step`: a (1,) int64 tensor on the device, or (B,) with each
  // row's own step.
  at::Tensor Sample(const at::Tensor& logits, const at::Tensor& step) const;

  // Whether any row needs the sorted path (top-k or top-p).
  bool sorts() const { return sorts_; }
  // Which kernels Sample runs (greedy only, any greedy row, sorting): a
  // captured step is valid while this is unchanged.
  int path() const { return (all_greedy_ ? 1 : 0) | (any_greedy_ ? 2 : 0) | (sorts_ ? 4 : 0); }

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
