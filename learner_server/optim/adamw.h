// AdamW (decoupled weight decay; Loshchilov & Hutter), the same update as
// torch.optim.AdamW, over a fixed list of parameters.
//
// The state (step count, first and second moments) is plain tensors so that
// checkpoints can save and restore it bit-exactly. Not thread-safe: the
// trainer owns it and calls Step() between backward passes.
//
// Optimizer is how a training step drives an optimizer, whether it holds
// every moment (AdamW) or this rank's share of them (ShardedAdamW, ZeRO-1):
// the same calls, in the same order, for both.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/sharded_checkpoint.h"

namespace asympo::learner {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Checks 0 <= beta < 1, eps > 0, weight_decay >= 0; names the bad option.
absl::Status ValidateAdamWOptions(const AdamWOptions& options);

// One AdamW update of `p` in place from its gradient `g` and moments `m`,
// `v` (all the same shape), at step `step` (1-based). Element-wise, so a
// slice of a tensor is updated exactly as the same elements of the whole
// (ShardedAdamW relies on it).
void AdamWUpdate(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr,
                 int64_t step, const AdamWOptions& options);

// The L2 norm of the parameters' gradients (an undefined one counts as
// zeros), with one host synchronisation for all of them.
double GradientNorm(const std::vector<at::Tensor>& params);

// A training step's update, after its gradients are in the parameters:
//   norm = ReduceGradients();  then, on the norm, either
//   Apply(lr, scale, stepped)  or  DropGradients()  (a skipped step).
// Each call leaves the parameters' gradients undefined, except
// ReduceGradients on an optimizer that does not reduce them.
// Each tensor's shape.
std::vector<std::vector<int64_t>> ShapesOf(const std::vector<at::Tensor>& tensors);
// Rank `rank` of `world`'s share of a tensor every rank holds whole, for a
// checkpoint: its 1/world of the flattened elements (ceil(n / world) each;
// the last ranks may have fewer or none).
StatePiece WriterShare(StateKind kind, size_t param, const at::Tensor& whole, int rank, int world);
// The pieces of a flat run of elements laid out as `offsets` (each
// parameter's first element in it) and `numels`: `chunk` holds elements
// [first, first + chunk.numel()) of the run; `index` maps a position in
// the run's parameter list to the model's parameter index. Only the
// elements below the run's end (its padding excluded), and only the
// parameters `keep` selects.
std::vector<StatePiece> RunPieces(StateKind kind, const at::Tensor& chunk, int64_t first,
                                  const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& numels,
                                  const std::vector<size_t>& index, const std::vector<bool>& keep);

class AdamW;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // True when ReduceGradients sums the gradients across data-parallel ranks
  // itself; otherwise the caller sums them first (StepReducer).
  virtual bool reduces_gradients() const = 0;
  // The L2 norm of the step's gradient: over every rank's, summed, when the
  // optimizer reduces them (a collective). A failed collective's status
  // passes through.
  virtual absl::StatusOr<double> ReduceGradients() = 0;
  // Forgets the step's gradient; nothing else changes.
  virtual void DropGradients() = 0;
  // Updates the parameters with `stepped[i]` true from the step's gradient
  // times `scale` (clipping), at learning rate `lr`.
  virtual absl::Status Apply(double lr, double scale, const std::vector<bool>& stepped) = 0;

  // Checkpoints (learner_server/trainer/checkpoint.h), written by every
  // rank in parallel and read back by any world. The pieces this rank
  // writes (`rank` of `world`), as views of its live tensors: what it alone
  // holds, and its 1/world of what every rank holds whole; moments only of
  // the parameters that have them (MomentsDefined).
  virtual std::vector<StatePiece> PiecesToWrite(int rank, int world) const = 0;
  // Per model parameter: whether it has moments (has been stepped).
  virtual std::vector<bool> MomentsDefined() const = 0;
  // The optimizer steps taken (AdamW's bias correction).
  virtual int64_t steps() const = 0;
  // Per model parameter, its shape (fully sharded, the parameters
  // themselves are empty between steps).
  virtual std::vector<std::vector<int64_t>> ParamShapes() const = 0;
  // Restoring: sets which parameters have moments (zeros until read) and
  // the step count; then PiecesToRead are views of everything this rank
  // holds, for the checkpoint's data to be copied into. `moments` has one
  // entry per model parameter.
  virtual void PrepareRestore(const std::vector<bool>& moments, int64_t steps) = 0;
  virtual std::vector<StatePiece> PiecesToRead() = 0;
  // The bytes of optimizer state this rank keeps between steps.
  virtual int64_t state_bytes() const = 0;

  // For an optimizer that keeps the weights themselves sharded (FullShard);
  // the defaults suit one whose weights are whole in the parameters.
  // Before a step's first forward pass: gathers what the step reads.
  virtual absl::Status BeginStep() { return absl::OkStatus(); }
  // True when every forward and backward pass is collective: then every
  // rank must run as many micro-batches, the most any rank has
  // (MostMicroBatches, a collective).
  virtual bool lockstep() const { return false; }
  virtual absl::StatusOr<int64_t> MostMicroBatches(int64_t mine) { return mine; }
  // Per parameter of `params` (the model's, in order), whether this rank
  // has a gradient for it in this step.
  virtual std::vector<bool> LocalGradients(const std::vector<at::Tensor>& params) const;
  // Makes the whole weights readable in the parameters on rank 0 (a
  // collective: every rank calls it), for publishing them; ReleaseWeights
  // frees them again.
  virtual absl::Status GatherWeights() { return absl::OkStatus(); }
  virtual void ReleaseWeights() {}
};

class AdamW : public Optimizer {
 public:
  // `params` are updated in place; their .grad() is read by Step().
  AdamW(std::vector<at::Tensor> params, AdamWOptions options);

  // Optimizer. The gradients are the ones in the parameters, and a parameter
  // is stepped when it has one (`stepped` must say the same: the
  // data-parallel exchange gives a gradient to every parameter any rank has
  // one for).
  bool reduces_gradients() const override { return false; }
  absl::StatusOr<double> ReduceGradients() override { return GradientNorm(params_); }
  void DropGradients() override { ZeroGrad(); }
  absl::Status Apply(double lr, double scale, const std::vector<bool>& stepped) override;
  std::vector<StatePiece> PiecesToWrite(int rank, int world) const override;
  std::vector<bool> MomentsDefined() const override;
  int64_t steps() const override { return step_; }
  std::vector<std::vector<int64_t>> ParamShapes() const override;
  void PrepareRestore(const std::vector<bool>& moments, int64_t steps) override;
  std::vector<StatePiece> PiecesToRead() override;
  int64_t state_bytes() const override;

  // One update with learning rate `lr` from the current gradients.
  // Parameters without a gradient are skipped (their state does not move).
  void Step(double lr);

  // Sets every parameter's gradient to undefined.
  void ZeroGrad();

  int64_t step_count() const { return step_; }
  // The moments per parameter, in parameter order; undefined for a
  // parameter that has never had a gradient.
  const std::vector<at::Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<at::Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  const AdamWOptions& options() const { return options_; }

  // The moments, in parameter order, for checkpoints: "exp_avg.<i>" and
  // "exp_avg_sq.<i>" (undefined entries are omitted).
  std::vector<std::pair<std::string, at::Tensor>> StateTensors() const;
  // Restores what StateTensors() returned (and the step count). Shapes must
  // match; errors name the entry. On error nothing changes. The tensors
  // are copied to the parameters' device and dtype.
  absl::Status LoadState(const std::vector<std::pair<std::string, at::Tensor>>& state,
                         int64_t step_count);

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace asympo::learner
