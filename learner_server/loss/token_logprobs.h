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

namespace asympo::learner {

// Log-probs of `targets` under logits = hidden @ weight^T, computed in chunks
// of `chunk_rows` rows so that full (rows, V) logits never exist at once:
// neither in the forward nor in the backward, which recomputes each chunk's
// logits instead of saving them.
//   hidden:  (M, H) the hidden state that predicts each target
//   weight:  (V, H) the output projection (lm_head / tied embeddings)
//   targets: (M,) int64 in [0, V)
// Returns (M,) float32 log-probs, differentiable w.r.t. hidden and weight.
// INVALID_ARGUMENT for bad shapes or ids; an exception from LibTorch in the
// forward (mixed dtypes, out-of-memory) comes back as a status
// (common/model/torch_errors.h); one in the backward is thrown by backward().
//
// Peak memory beyond the inputs, their gradients and the (M,) outputs, for
// float32 inputs (ChunkedLogProbsPeakBytes): the forward and the backward
// each hold at most two (chunk_rows, V) float32 buffers at a time (a chunk's
// logits and their log_softmax, or softmax in the backward), and nothing is
// saved between them but the inputs:
//     peak_extra = 2 * min(M, chunk_rows) * V * 4 bytes.
// The unchunked path holds (M, V) logits and a same-size log_softmax for the
// backward: 2 * M * V * 4 bytes.
absl::StatusOr<at::Tensor> ChunkedTokenLogProbs(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t chunk_rows);

// The bound stated above, in bytes.
int64_t ChunkedLogProbsPeakBytes(int64_t rows, int64_t vocab, int64_t chunk_rows);

}  // namespace asympo::learner
