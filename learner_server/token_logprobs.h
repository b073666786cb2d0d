// Per-token log-probabilities of sampled responses under the current policy.
//
// Responses in a micro-batch have different lengths, so they arrive padded to
// a common length T with a mask that marks the real tokens. Stateless and
// thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"

namespace asympo::learner {

// Returns (N, T) log pi(targets[n, t] | ...) = logits[n, t, targets] -
// logsumexp(logits[n, t, :]) where mask[n, t] is true, and exactly 0 where it
// is false (whatever id the padding holds). Differentiable
// with respect to `logits`.
//   logits:  (N, T, V) floating; position t predicts token t.
//   targets: (N, T) int64; ids in [0, V) wherever mask is true.
//   mask:    (N, T) bool (or 0/1 of any dtype).
// Holds one (N, T) logsumexp and no (N, T, V) temporary besides autograd's.
absl::StatusOr<at::Tensor> TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets,
                                         const at::Tensor& mask);

// A padded batch of variable-length id sequences.
struct PaddedSequences {
  at::Tensor ids;   // (N, T) int64, padding filled with `pad_id`
  at::Tensor mask;  // (N, T) bool, true on real tokens
};

// Right-pads `sequences` to the longest one (at least 1 column).
PaddedSequences PadSequences(const std::vector<std::vector<int32_t>>& sequences,
                             int64_t pad_id = 0);

}  // namespace asympo::learner
