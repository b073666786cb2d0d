// How a step's prompt groups become the micro-batches the trainer runs.
//
// A MicroBatchLayout first cuts the step's groups, in order and whole, into
// micro-batches (Split), then lays one out as tensors on the host (Build);
// the trainer builds each just before its forward pass, so only one
// micro-batch's tensors are alive at a time. The loss needs whole groups in
// a micro-batch (its advantages are per group), and it reads each response
// through `hidden_rows` and `response_mask`, so a layout is free to place
// the sequences as it likes: PaddedLayout gives each response a row of its
// own, padded to the micro-batch's longest; a packer can put several
// sequences in one row with their own positions.
//
// Layouts are immutable after construction and thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "learner_server/group_queue.h"

namespace asympo::learner {

// One micro-batch of whole groups as host tensors, N rows of T positions
// holding its responses (prompt + response each) and M response tokens in
// all. The hidden state of flat position hidden_rows[k] (row * T + column)
// predicts targets[k].
struct MicroBatch {
  int64_t rows = 0;              // N: responses
  int64_t longest = 0;           // T: row length
  int64_t longest_response = 0;  // R
  int64_t groups = 0;
  at::Tensor ids;                    // (N, T) int64, padded
  at::Tensor positions;              // (N, T) int64: each token's position in its sequence
  at::Tensor key_mask;               // (N, T) bool, true on real tokens
  at::Tensor response_mask;          // (N, R) bool
  at::Tensor rewards;                // (N,) float
  at::Tensor group_index;            // (N,) int64 in [0, groups)
  at::Tensor behavior;               // (N, R) float; only with behavior log-probs
  std::vector<int64_t> hidden_rows;  // (M,) flat N*T index of each response token's predictor
  std::vector<int64_t> targets;      // (M,) the response tokens
};

class MicroBatchLayout {
 public:
  virtual ~MicroBatchLayout() = default;
  // The step's groups cut, in order and whole, into micro-batches; the
  // pointers point into `groups`.
  virtual std::vector<std::vector<const QueuedGroup*>> Split(
      const std::vector<QueuedGroup>& groups) const = 0;
  // One micro-batch of `groups` as tensors. INVALID_ARGUMENT for a token
  // outside the vocabulary.
  virtual absl::StatusOr<MicroBatch> Build(const std::vector<const QueuedGroup*>& groups) const = 0;
};

struct PaddedLayoutOptions {
  // Padded tokens (rows x longest sequence) per micro-batch; a group larger
  // than that forms a micro-batch of its own.
  int64_t micro_batch_tokens = 16384;
  int64_t vocab_size = 0;
  int64_t pad_token_id = 0;
  // Lay out the responses' behavior log-probs (grpo).
  bool behavior_logprobs = false;
};

// One row per response, padded to the micro-batch's longest sequence.
class PaddedLayout : public MicroBatchLayout {
 public:
  explicit PaddedLayout(PaddedLayoutOptions options) : options_(options) {}
  std::vector<std::vector<const QueuedGroup*>> Split(
      const std::vector<QueuedGroup>& groups) const override;
  absl::StatusOr<MicroBatch> Build(const std::vector<const QueuedGroup*>& groups) const override;

 private:
  PaddedLayoutOptions options_;
};

}  // namespace asympo::learner
