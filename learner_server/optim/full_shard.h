// Fully sharded data parallelism (ZeRO stage 3, FSDP's FULL_SHARD): each
// rank keeps 1/world_size of the float32 master weights, of the gradients
// and of the AdamW moments.
//
// The parameters form units: one per decoder layer, and a root unit of the
// rest (embed_tokens, the final norm, lm_head when untied). Each unit's
// parameters, flattened end to end (U elements), are cut into world_size
// chunks of c = ceil(U / world_size): rank r keeps elements [r c, (r + 1) c)
// of the weights and of both moments, and during a step of the summed
// gradient. Between steps the model's parameters hold nothing (empty
// tensors). In a step:
//   - BeginStep all-gathers the root unit, which stays whole for the step
//     (the embedding and the log-prob projection read it); its gradients
//     accumulate in .grad as usual;
//   - each decoder layer is all-gathered for its forward and freed after it
//     (the model calls Gather / Release: PolicyModel::set_layer_residency),
//     and in the backward all-gathered again, recomputed, differentiated and
//     freed; its gradients are reduce-scattered into this rank's chunk at
//     once (ReduceGradients(layer, ...)), micro-batch by micro-batch;
//   - ReduceGradients() reduce-scatters the root unit's gradients, frees it,
//     and returns the global norm; Apply updates this rank's chunks only.
// Every forward and backward pass is collective, so every rank runs as many
// micro-batches (lockstep(), MostMicroBatches): the trainer pads a rank
// with fewer with passes of one token and a zero loss.
//
// Reading the whole weights (publishing a snapshot, an export) gathers them
// on rank 0 for the time of the read: GatherWeights / ReleaseWeights (a
// snapshot: on the device, where the publisher stages it), VisitUnits (an
// export: unit by unit into host memory). A checkpoint needs no gather:
// every rank writes its own chunks (PiecesToWrite), and any world size and
// sharding mode resumes it, each rank reading its chunks (PiecesToRead).
//
// The update is element-wise (AdamWUpdate), so the weights equal those of
// one process given the same summed gradients (to float rounding: the sums
// are taken in another order).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "learner_server/optim/adamw.h"
#include "learner_server/optim/sharded_adamw.h"

namespace asympo::learner {

class FullShard : public Optimizer, public LayerResidency {
 public:
  // Collective. Every rank's `model` must hold the same whole weights (after
  // DataParallel::BroadcastState); each keeps its chunks and empties the
  // model's parameters, and takes its chunk of rank 0's `state` (its moments
  // and step count; ignored elsewhere). `model` and `collectives` must
  // outlive the shard; the model's layers run through it until it is
  // destroyed.
  static absl::StatusOr<std::unique_ptr<FullShard>> Create(PolicyModel* model, AdamWOptions options,
                                                           ShardCollectives* collectives,
                                                           const AdamW& state);
  ~FullShard() override;

  // Optimizer.
  bool reduces_gradients() const override { return true; }
  absl::StatusOr<double> ReduceGradients() override;
  void DropGradients() override;
  absl::Status Apply(double lr, double scale, const std::vector<bool>& stepped) override;
  // Checkpoints: this rank's chunk of every unit's weights and moments,
  // written and read back as they are.
  std::vector<StatePiece> PiecesToWrite(int /*rank*/, int /*world*/) const override {
    return Pieces();
  }
  std::vector<bool> MomentsDefined() const override { return has_state_; }
  int64_t steps() const override { return step_; }
  std::vector<std::vector<int64_t>> ParamShapes() const override;
  void PrepareRestore(const std::vector<bool>& moments, int64_t steps) override;
  std::vector<StatePiece> PiecesToRead() override { return Pieces(); }
  // The moments this rank keeps (2 c floats per unit).
  int64_t state_bytes() const override;
  absl::Status BeginStep() override;
  bool lockstep() const override { return true; }
  absl::StatusOr<int64_t> MostMicroBatches(int64_t mine) override;
  std::vector<bool> LocalGradients(const std::vector<at::Tensor>& params) const override;
  absl::Status GatherWeights() override;
  void ReleaseWeights() override;
  // Collective: gathers each unit on rank 0's device in turn and there
  // calls `fn` with the model positions of its parameters (whole in the
  // model for the call), then frees it: rank 0 holds one unit beyond its
  // chunks. Every unit is gathered even after `fn` fails; its first
  // failure is returned (a failed collective's first).
  absl::Status VisitUnits(const std::function<absl::Status(const std::vector<size_t>&)>& fn);

  // LayerResidency: decoder layer `layer` is unit layer + 1. A failed
  // collective is kept (status()) and makes the rest of the step's
  // collectives no-ops; the step's exchange then fails on every rank.
  void Gather(int64_t layer) override { GatherUnit(static_cast<size_t>(layer) + 1); }
  void Release(int64_t layer) override { ReleaseUnit(static_cast<size_t>(layer) + 1); }
  void ReduceGradients(int64_t layer, const std::vector<at::Tensor>& grads) override;

  // The first collective failure since BeginStep.
  const absl::Status& status() const { return failed_; }
  // This rank's master weights, in bytes (c floats per unit).
  int64_t weight_bytes() const;
  // The floats of the largest unit, gathered whole during a step.
  int64_t largest_unit() const;
  int64_t units() const { return static_cast<int64_t>(units_.size()); }

 private:
  struct Unit {
    std::vector<at::Tensor> params;            // the model's tensors
    std::vector<size_t> index;                 // each one's position in model->parameters()
    std::vector<int64_t> offsets;              // each one's first element in the unit
    std::vector<std::vector<int64_t>> shapes;  // each one's shape
    std::vector<int64_t> numels;               // and elements
    int64_t total = 0;                         // U
    int64_t chunk = 0;                         // c
    at::Tensor weight, exp_avg, exp_avg_sq;    // this rank's chunk (c)
    at::Tensor grad;                           // its summed gradient (c), during a step
    at::Tensor whole;                          // world * c while gathered
  };

  FullShard(PolicyModel* model, AdamWOptions options, ShardCollectives* collectives);
  // The unit's `tensors` (one per parameter; undefined ones as zeros) laid
  // end to end in a new (world * c) buffer.
  at::Tensor Flatten(const Unit& unit, const std::vector<at::Tensor>& tensors) const;
  // The world's pieces of a (world * c) buffer: piece r is rank r's chunk.
  std::vector<at::Tensor> Pieces(const Unit& unit, const at::Tensor& flat) const;
  // Collective: every rank's `chunk` (c elements of `unit`), laid end to end
  // on rank 0's device (world * c); undefined on the other ranks.
  absl::StatusOr<at::Tensor> GatherOnRank0(const Unit& unit, const at::Tensor& chunk);
  // This rank's chunks, per parameter (moments of those that have them).
  std::vector<StatePiece> Pieces() const;
  // Points the unit's parameters at `whole` (world * c).
  void Attach(Unit& unit, at::Tensor whole);
  void GatherUnit(size_t u);
  void ReleaseUnit(size_t u);
  // Sums `flat` (world * c) across ranks into this rank's chunk, added to
  // unit.grad.
  void ReduceScatterInto(Unit& unit, const at::Tensor& flat);
  absl::Status ScatterState(const AdamW& state);
  // Keeps the first failure; true while there is none.
  bool Ok(const absl::Status& s);

  PolicyModel* model_;
  AdamWOptions options_;
  ShardCollectives* collectives_;
  std::vector<Unit> units_;
  std::vector<bool> local_grad_;  // per model parameter: a layer gradient reduced this step
  std::vector<bool> has_state_;   // per model parameter: stepped at least once
  absl::Status failed_;
  int64_t step_ = 0;
};

}  // namespace asympo::learner
