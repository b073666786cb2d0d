// AdamW with its state sharded across data-parallel ranks (ZeRO stage 1).
//
// The parameters, flattened and laid end to end (P elements), are cut into
// world_size equal chunks of c = ceil(P / world_size) elements: rank r owns
// elements [r c, (r + 1) c) and keeps the AdamW moments of those elements
// only, 2 P / world_size floats instead of 2 P. A step:
//   1. reduce-scatter: each rank receives the sum over ranks of its chunk of
//      the gradient (ReduceGradients, which also returns the global norm);
//   2. the trainer decides to clip or skip (every rank sees the same norm);
//   3. each rank applies AdamW to its chunk of the weights and all-gathers
//      the updated chunks, so every rank holds every weight again (Apply).
// The exchanges go in rounds of at most kBucketElements floats in all, so
// the temporary buffers stay bounded whatever the model's size.
//
// The update is element-wise (AdamWUpdate), so the weights equal those of
// an unsharded AdamW given the same summed gradients. A parameter that no
// rank has a gradient for keeps its weights and moments, as AdamW does.
//
// Checkpoints are written by every rank: its chunk of the moments and its
// share of the weights (PiecesToWrite); any world resumes them, each rank
// reading its own chunk (PiecesToRead). ScatterState hands each rank its
// chunk of rank 0's AdamW when the optimizer is sharded.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "learner_server/optim/adamw.h"

namespace asympo::learner {

// The collectives a sharded optimizer needs; each call is made by every
// rank in the same order (DataParallel implements them on c10d).
class ShardCollectives {
 public:
  virtual ~ShardCollectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // `inputs` holds world_size() tensors of one size; `output` (that size)
  // receives the sum over ranks of their inputs[rank()].
  virtual absl::Status ReduceScatter(std::vector<at::Tensor>& inputs, at::Tensor& output) = 0;
  // outputs[r] (world_size() tensors of the input's size) receives rank r's
  // input.
  virtual absl::Status AllGather(at::Tensor& input, std::vector<at::Tensor>& outputs) = 0;
  // On rank 0, outputs[r] receives rank r's input; elsewhere `outputs` is
  // empty.
  virtual absl::Status GatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs) = 0;
  // `output` receives rank 0's inputs[rank()]; `inputs` is empty elsewhere.
  virtual absl::Status ScatterFromRank0(std::vector<at::Tensor>& inputs, at::Tensor& output) = 0;
  // Sums `values` element-wise across ranks, in place.
  virtual absl::Status SumValues(std::vector<double>* values) = 0;
};

class ShardedAdamW : public Optimizer {
 public:
  // Float elements exchanged per round, over all ranks (64 MiB).
  static constexpr int64_t kBucketElements = int64_t{16} << 20;

  // `params` (float32, one device) are updated in place; `collectives`
  // must outlive this. `bucket_elements`: the floats exchanged per round.
  ShardedAdamW(std::vector<at::Tensor> params, AdamWOptions options, ShardCollectives* collectives,
               int64_t bucket_elements = kBucketElements);

  // Optimizer: the gradients are this rank's own until ReduceGradients.
  bool reduces_gradients() const override { return true; }
  // Step 1: reduce-scatters the parameters' gradients (an undefined one
  // counts as zeros) into this rank's chunk, clears the parameters'
  // gradients, and returns the global L2 norm of the summed gradient. A
  // failed collective's status passes through.
  absl::StatusOr<double> ReduceGradients() override;
  // Drops the reduced chunk (a skipped step).
  void DropGradients() override;
  // Step 3: scales the reduced chunk by `scale` (clipping), applies AdamW
  // with learning rate `lr` to this rank's elements of the parameters with
  // `stepped[i]` true, and all-gathers the weights into every rank's
  // parameters.
  absl::Status Apply(double lr, double scale, const std::vector<bool>& stepped) override;

  // Checkpoints: this rank's chunk of the moments, and its writer share
  // of the weights (every rank holds them whole, and reads them whole).
  std::vector<StatePiece> PiecesToWrite(int rank, int world) const override;
  std::vector<bool> MomentsDefined() const override { return has_state_; }
  int64_t steps() const override { return step_; }
  std::vector<std::vector<int64_t>> ParamShapes() const override { return ShapesOf(params_); }
  void PrepareRestore(const std::vector<bool>& moments, int64_t steps) override;
  std::vector<StatePiece> PiecesToRead() override;
  // Collective. Each rank takes its chunk of rank 0's `full` (ignored
  // elsewhere) and its step count.
  absl::Status ScatterState(const AdamW& full);

  int64_t step_count() const { return step_; }
  // This rank's moments in bytes (2 c floats).
  int64_t state_bytes() const override;
  int64_t chunk_elements() const { return chunk_; }
  int64_t rounds() const { return Rounds(); }

 private:
  // Elements [begin, begin + out.numel()) of the flattened concatenation of
  // `tensors` (undefined ones read as zeros, past the end as zeros).
  void ReadFlat(const std::vector<at::Tensor>& tensors, int64_t begin, at::Tensor out) const;
  // The reverse, into the parameters; elements past the end are dropped.
  void WriteParams(int64_t begin, const at::Tensor& in);
  std::vector<at::Tensor> Gradients() const;
  // This rank's chunk of both moments, per parameter that has them.
  std::vector<StatePiece> MomentPieces() const;
  // Round k: its first element within a chunk and its length.
  int64_t RoundBegin(int64_t k) const { return k * piece_; }
  int64_t RoundLength(int64_t k) const;
  int64_t Rounds() const;

  std::vector<at::Tensor> params_;
  std::vector<int64_t> offsets_;  // each parameter's first flat element
  AdamWOptions options_;
  ShardCollectives* collectives_;
  int64_t total_ = 0;                // P
  int64_t chunk_ = 0;                // c
  int64_t piece_ = 0;                // elements per rank per round
  at::Tensor exp_avg_, exp_avg_sq_;  // this rank's chunk (c)
  at::Tensor grad_;                  // the reduced chunk during a step
  std::vector<bool> has_state_;      // per parameter: stepped at least once
  int64_t step_ = 0;
};

}  // namespace asympo::learner
