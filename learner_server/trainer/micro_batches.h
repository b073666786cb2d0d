// How a step's prompt groups become the micro-batches the trainer runs.
//
// A MicroBatchLayout first cuts the step's groups, in order and whole, into
// micro-batches (Split), then lays one out as tensors on the host (Build);
// the trainer builds each just before its forward pass, so only one
// micro-batch's tensors are alive at a time. The loss needs whole groups in
// a micro-batch (its advantages are per group), and it reads each response
// through `hidden_rows` and `response_mask`, so a layout is free to place
// the sequences as it likes: PaddedLayout gives each response a row of its
// own, padded to the micro-batch's longest; PackedLayout puts several
// sequences in one row, each with its own positions and segment.
//
// Layouts are immutable after construction and thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "learner_server/admission/group_queue.h"

namespace asympo::learner {

// One micro-batch of whole groups as host tensors: N responses, laid out
// in `rows` rows of T positions (one response a row, padded; or several
// packed one after another), M response tokens in all. The hidden state of
// flat position hidden_rows[k] (row * T + column) predicts targets[k]; the
// targets are in response order (response 0's tokens first).
struct MicroBatch {
  int64_t responses = 0;         // N
  int64_t rows = 0;              // rows of the tensors below
  int64_t longest = 0;           // T: row length
  int64_t longest_response = 0;  // R
  int64_t groups = 0;
  at::Tensor ids;                    // (rows, T) int64, padded
  at::Tensor positions;              // (rows, T) int64: each token's position in its sequence
  at::Tensor key_mask;               // (rows, T) bool, true on real tokens
  at::Tensor segments;               // (rows, T) int64 sequence of each token; packed only
  at::Tensor response_mask;          // (N, R) bool
  at::Tensor rewards;                // (N,) float
  at::Tensor group_index;            // (N,) int64 in [0, groups)
  at::Tensor behavior;               // (N, R) float; only with behavior log-probs
  std::vector<int64_t> hidden_rows;  // (M,) flat rows*T index of each response token's predictor
  std::vector<int64_t> targets;      // (M,) the response tokens
  // Token positions computed (rows x T) and, of them, real tokens.
  int64_t padded_tokens() const { return rows * longest; }
  int64_t real_tokens = 0;
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
  // Tokens per micro-batch: padded (rows x longest sequence) for
  // PaddedLayout, real for PackedLayout; a group larger than that forms a
  // micro-batch of its own.
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

// Packed sequences: Split fills each micro-batch with whole groups up to
// micro_batch_tokens real tokens (prompt + response of every response; a
// group larger than that alone), counting no padding. Build places the
// sequences, longest first, into rows as long as the micro-batch's longest
// sequence (first fit), one after another with no padding between them;
// each has its own positions (from 0) and segment, so attention is
// block-diagonal causal. Only the ends of rows are padded. Attention costs
// what a padded micro-batch's does per row, over fewer rows.
class PackedLayout : public MicroBatchLayout {
 public:
  explicit PackedLayout(PaddedLayoutOptions options) : options_(options) {}
  std::vector<std::vector<const QueuedGroup*>> Split(
      const std::vector<QueuedGroup>& groups) const override;
  absl::StatusOr<MicroBatch> Build(const std::vector<const QueuedGroup*>& groups) const override;

 private:
  PaddedLayoutOptions options_;
};

}  // namespace asympo::learner
