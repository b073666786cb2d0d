// The trainer: one optimizer step from a step's prompt groups.
//
// A step reads as the algorithm: lay out (the step's groups, whole, into
// micro-batches: micro_batches.h), forward and loss (the policy on
// prompt + response, the response tokens' log-probs, the objective with the
// step's totals, so that micro-batch gradients add up to the whole step's),
// backward (accumulating gradients, pooling diagnostics: loss_diagnostics.h),
// reduce (data-parallel: across ranks, step_exchange.h), clip, update
// (AdamW or its sharded form, behind one Optimizer: adamw.h) and publish
// (the version increments and the new weights go to the WeightPublisher).
//
// A step that fails (a non-finite loss or gradient, bad data that slipped
// past validation, a LibTorch error such as out-of-memory) leaves the
// weights, the optimizer state and the version as they were, and says why
// (StepOr::reason(), the metric label: skip_reason.h).
//
// Not thread-safe: one trainer thread owns it (and the model's weights),
// except version(), which any thread may read.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/policy_model.h"
#include "common/model/torch_errors.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/loss/loss_diagnostics.h"
#include "learner_server/loss/policy_loss.h"
#include "learner_server/optim/adamw.h"
#include "learner_server/optim/full_shard.h"
#include "learner_server/optim/lr_schedule.h"
#include "learner_server/optim/sharded_adamw.h"
#include "learner_server/trainer/micro_batches.h"
#include "learner_server/trainer/skip_reason.h"
#include "learner_server/trainer/step_exchange.h"
#include "learner_server/trainer/step_faults.h"

namespace asympo::learner {

// Where each new version of the weights goes (the weight broadcaster in the
// daemon). Publish is called on the trainer thread after every step; it
// must not keep references to the model's tensors beyond the call.
// A part of the weights (positions in model.named_parameters()), readable
// in the model while the call lasts.
using StagePart = std::function<absl::Status(const std::vector<size_t>& params)>;
// Calls its argument for each part of the weights as it becomes readable:
// all at once, or a unit at a time on a fully sharded learner (a
// collective there: it runs to its end on every rank). Its failure is a
// failed collective.
using WeightParts = std::function<absl::Status(const StagePart& stage)>;

// The parts of a model whose weights are all readable: one, all of them.
WeightParts WholeWeights(const PolicyModel& model);

// A StagePart that reads nothing: for a rank (or a version) that only takes
// part in the collective.
inline absl::Status StageNothing(const std::vector<size_t>& /*params*/) { return absl::OkStatus(); }

class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  // Publishes `version`, reading the weights through `parts`, which it must
  // call exactly once (whether it publishes this version or not).
  virtual absl::Status Publish(uint64_t version, const PolicyModel& model,
                               const WeightParts& parts) = 0;
  // With every weight readable.
  absl::Status Publish(uint64_t version, const PolicyModel& model) {
    return Publish(version, model, WholeWeights(model));
  }
};

struct TrainerOptions {
  PolicyLossOptions loss;
  LrScheduleOptions lr;
  AdamWOptions adamw;
  // Clip the global gradient norm to this value; <= 0 disables clipping.
  double max_grad_norm = 1.0;
  // Tokens per micro-batch: real ones with packed sequences, padded ones
  // (sequences x longest sequence) without. A group larger than the budget
  // forms a micro-batch of its own.
  int64_t micro_batch_tokens = 16384;
  // Packed sequences (PackedLayout: several sequences a row, no padding
  // between them) or one padded row per response (PaddedLayout).
  bool pack_sequences = true;
  // Rows of logits computed at once by the chunked log-prob path.
  int64_t logprob_chunk_rows = 1024;
  int64_t pad_token_id = 0;
  // The nominal step size in groups (--prompts_per_step): a short step
  // (fewer groups, trained after --partial_step_after) weights each of its
  // groups as a full step does (StepTotals::step_groups). 0: every step
  // weighs as a whole.
  int64_t step_groups = 0;
  // Publish every Nth version (--broadcast_every; 0: none). A version not
  // published is not read at all: fully sharded, no rank gathers its units.
  // Every rank must hold the same value (LearnerCore::SyncRanks: rank 0's).
  int64_t publish_every = 1;
  // Fault injection, for tests and drills only: the Nth step attempt
  // (a call of Step() or StepShard(), 1-based, counted by this trainer) gets a NaN loss
  // (nonfinite_loss_steps) or a c10::Error thrown after its first
  // micro-batch's backward pass (exception_steps).
  std::vector<int64_t> fault_nonfinite_loss_steps;
  std::vector<int64_t> fault_exception_steps;
};

absl::Status ValidateTrainerOptions(const TrainerOptions& options);

// A step's totals over all its groups (what each micro-batch's loss, and
// each data-parallel rank's, divides by).
StepTotals StepTotalsOf(const std::vector<QueuedGroup>& groups);

// Each group's staleness when a step from version `version` trains on it:
// the versions between its arrival and its use.
std::vector<uint64_t> StalenessOf(const std::vector<QueuedGroup>& groups, uint64_t version);

struct StepResult {
  uint64_t version = 0;         // after the step
  LossDiagnostics diagnostics;  // pooled over the step's micro-batches
  double grad_norm = 0;         // before clipping
  double learning_rate = 0;
  int64_t micro_batches = 0;
  int64_t tokens = 0;  // prompt + response tokens processed
  double seconds = 0;
  // Per trained group, StalenessOf. Step sets it; StepShard does not (a
  // shard is not the step): the caller that split the step sets it for the
  // whole step's groups.
  std::vector<uint64_t> staleness;
  // Indices (into Step's groups) of the groups dropped from the step because
  // each alone made the loss or the gradient non-finite (a poisoned group);
  // the step trained on the others.
  std::vector<size_t> dropped;
  std::vector<std::string> dropped_sources;  // their QueuedGroup::source, in order
};

class Trainer {
 public:
  // `model` must outlive the trainer; `publisher` may be null.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerOptions options, PolicyModel* model,
                                                         WeightPublisher* publisher);

  // Trains one step on `groups` (at least one). When the step's loss or
  // gradient is not finite, each group is tried alone: the groups that are
  // non-finite by their rewards are dropped (StepResult::dropped) and the
  // step trains on the rest, as if they had never been popped. On error
  // (bad data that slipped past validation, a non-finite step with no group
  // to blame, or every group to blame: SkipReason::kPoisonedGroups; an
  // exception from LibTorch) the weights and the optimizer are unchanged,
  // the gradients are cleared, the version does not move, and the failure
  // carries its SkipReason. Never throws.
  StepOr<StepResult> Step(std::vector<QueuedGroup> groups);

  // One data-parallel step: this rank's `shard` of a step whose totals over
  // all ranks are `totals` (shards may be empty). The gradients and the
  // diagnostics are summed across ranks by `reducer`, then every rank
  // clips and steps alike, so the weights stay equal to a single process
  // training all the groups. A failure on any rank skips the step on every
  // rank (with a failing rank's reason), except that each rank first drops
  // the groups of its shard that are non-finite by their rewards, as Step
  // does (StepResult::dropped indexes `shard`; the step's totals still
  // count them); a step whose every group was dropped is skipped as
  // kPoisonedGroups. A failed collective returns the reducer's status as
  // it is: the job cannot go on (IsRankFailure). `staleness` is left empty
  // (StepResult); `seconds` includes the exchange.
  StepOr<StepResult> StepShard(const std::vector<QueuedGroup>& shard, const StepTotals& totals,
                               StepReducer* reducer);

  // The first half of Step: zeroes and then accumulates the step's
  // gradients in the model's parameters, micro-batch by micro-batch, and
  // returns the pooled diagnostics (version, learning rate and grad norm
  // unset). Leaves the weights and the optimizer untouched. Never throws.
  StepOr<StepResult> ComputeGradients(const std::vector<QueuedGroup>& groups);

  // ZeRO-1: from now on the optimizer keeps 1/world_size of the AdamW
  // moments on this rank (ShardedAdamW over `collectives`, which must
  // outlive the trainer), and steps go through it. Collective: rank 0's
  // optimizer state (restored from a checkpoint, say) is split across the
  // ranks, and optimizer() holds no moments afterwards.
  absl::Status ShardOptimizer(ShardCollectives* collectives);
  // Fully sharded data parallelism (FullShard): from now on this rank keeps
  // 1/world_size of the master weights, the gradients and the moments, and
  // steps run in lockstep with the other ranks (a rank cannot retry its
  // groups alone: a step that is not finite is skipped on every rank).
  // Collective: every rank's model must hold rank 0's weights, and rank 0's
  // optimizer state is split across the ranks. The model's parameters are
  // empty between steps.
  absl::Status ShardFully(ShardCollectives* collectives);
  // Whether ShardOptimizer or ShardFully was called.
  bool optimizer_sharded() const { return sharded_ != nullptr; }
  // The FullShard after ShardFully; null otherwise.
  const FullShard* full_shard() const { return full_; }
  // The optimizer state this rank keeps between steps, in bytes.
  int64_t optimizer_state_bytes() const { return stepper_->state_bytes(); }

  // The policy version: optimizer steps applied. Any thread.
  uint64_t version() const { return version_.load(); }
  // For restoring from a checkpoint.
  void set_version(uint64_t version) { version_ = version; }
  void set_publish_every(int64_t every) { options_.publish_every = every; }
  // The whole AdamW state before the optimizer is sharded (see
  // ShardOptimizer); rank 0's is scattered from it.
  AdamW& optimizer() { return optimizer_; }
  // The weights, part by part (WeightParts): a unit at a time gathered on
  // rank 0 when fully sharded (a collective), else all at once.
  absl::Status VisitWeightParts(const StagePart& stage);
  // What updates the weights, and what checkpoints write and restore:
  // optimizer(), or its sharded form.
  Optimizer& stepper() { return *stepper_; }
  const TrainerOptions& options() const { return options_; }
  const PolicyLoss& loss() const { return loss_; }
  PolicyModel& model() { return *model_; }

 private:
  // Once sharded: optimizer() keeps no moments (its step count stays).
  void DropWholeMoments();
  // What one rank's backward passes over some groups produced, before any
  // exchange; the gradients are in the model's parameters.
  struct Accumulated {
    DiagnosticSums diagnostics;
    int64_t tokens = 0;  // prompt + response tokens processed
    int64_t micro_batches = 0;
    std::vector<size_t> dropped;  // as StepResult's
    std::vector<std::string> dropped_sources;
  };

  Trainer(TrainerOptions options, PolicyLoss loss, PolicyModel* model, WeightPublisher* publisher);

  // Runs `fn` (returning a StepOr) under GuardTorch; a failure clears the
  // gradients and, when it is an exception, takes its reason from its code.
  template <typename Fn>
  auto Guarded(absl::string_view what, Fn&& fn) -> decltype(fn()) {
    auto result = GuardTorch(what, std::forward<Fn>(fn));
    if (!result.ok()) optimizer_.ZeroGrad();
    return result;
  }
  // Step without the exception guard and the second try.
  StepOr<StepResult> StepUnguarded(const std::vector<QueuedGroup>& groups);
  // Lay out, forward and loss, backward: zeroes the gradients, then
  // accumulates those of `groups` micro-batch by micro-batch.
  StepOr<Accumulated> Accumulate(const std::vector<QueuedGroup>& groups, const StepTotals& totals);
  // Accumulate's loop when every pass is collective (full sharding): as
  // many micro-batches as the rank with the most, padded with IdlePass; a
  // failing micro-batch still runs a backward (of zero), and the failure
  // is returned after the last.
  StepOr<Accumulated> AccumulateInLockstep(
      const std::vector<std::vector<const QueuedGroup*>>& micro, const StepTotals& totals,
      Accumulated local);
  // A forward and backward pass of one token with a zero loss.
  void IdlePass();
  // One micro-batch's forward pass: the hidden states (rows, T, H).
  at::Tensor Hidden(const MicroBatch& batch);
  // Its loss, from those hidden states.
  StepOr<LossOutput> LossOf(const MicroBatch& batch, const at::Tensor& hidden,
                            const StepTotals& totals);
  // StepShard's exchange: sums `exchange` (this rank's share, from `local`)
  // across ranks, and the gradients too unless the optimizer reduces them.
  // Fails with a failing rank's reason, or when no rank has a group left.
  StepOr<StepResult> Reduce(const StepOr<Accumulated>& local, StepExchange& exchange,
                            StepReducer& reducer);
  // Reduce (the optimizer's part: ZeRO-1's reduce-scatter), clip, update
  // and publish, from the accumulated gradients; `stepped`: per parameter,
  // whether any rank has a gradient for it.
  StepOr<StepResult> Update(StepResult result, const std::vector<bool>& stepped);
  // Bumps the version and publishes the weights; returns the new version,
  // or the failed collective that gathered sharded weights.
  absl::StatusOr<uint64_t> Publish();
  // This rank's share of the exchange.
  StepExchange ExchangeOf(const StepOr<Accumulated>& local) const;
  // The step's result from what its backward passes accumulated.
  static StepResult ResultOf(const Accumulated& local);
  // Per parameter, whether it has a gradient here.
  std::vector<bool> Stepped() const;
  static StepFailure NonFiniteGradient();

  // The second tries (trainer_isolation.cc). Step's after `failure`:
  // `failure` itself unless it is a non-finite loss or gradient with
  // poison to blame.
  StepOr<StepResult> StepWithoutPoisonedGroups(const std::vector<QueuedGroup>& groups,
                                               const StepFailure& failure);
  // StepShard's local half after `failure`: this rank's shard without its
  // poisoned groups (the step's totals unchanged; possibly no group left).
  StepOr<Accumulated> ShardWithoutPoisonedGroups(const std::vector<QueuedGroup>& shard,
                                                 const StepTotals& totals,
                                                 const StepFailure& failure);
  // The indices of `groups` that are non-finite by their rewards (each
  // tried alone, then with its rewards' signs), or `failure` when that is not
  // a non-finite loss or gradient, or a group is non-finite for another
  // reason (the model's) or fails otherwise.
  StepOr<std::vector<size_t>> PoisonedGroups(const std::vector<QueuedGroup>& groups,
                                             const StepFailure& failure);
  // The gradient norm of `group` alone, when finite (a failure otherwise);
  // leaves no gradient behind.
  StepOr<double> TryAlone(const QueuedGroup& group);

  TrainerOptions options_;
  PolicyLoss loss_;
  PolicyModel* model_;
  WeightPublisher* publisher_;
  std::unique_ptr<MicroBatchLayout> layout_;
  StepFaults faults_;
  AdamW optimizer_;                     // every moment; none once sharded (but a checkpoint's)
  std::unique_ptr<Optimizer> sharded_;  // set by ShardOptimizer or ShardFully
  FullShard* full_ = nullptr;           // sharded_, after ShardFully
  Optimizer* stepper_ = &optimizer_;    // what updates: optimizer_, or sharded_
  std::atomic<uint64_t> version_{0};
};

}  // namespace asympo::learner
