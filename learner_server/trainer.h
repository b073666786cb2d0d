// The trainer: one optimizer step from a step's prompt groups.
//
// A step's groups are packed whole into micro-batches under a token budget;
// each micro-batch runs the policy on prompt + response, takes the response
// tokens' log-probs (chunked), applies the objective with the step's totals
// (so micro-batch gradients add up to the whole step's), and backpropagates.
// Then gradients are clipped, AdamW steps with the scheduled learning rate,
// the version increments and the new weights go to the WeightPublisher.
//
// A step that fails (a non-finite loss or gradient, bad data that slipped
// past validation, a LibTorch error such as out-of-memory) leaves the
// weights, the optimizer state and the version as they were, and its
// status carries the reason for the metric label (StepSkipReason).
//
// Not thread-safe: one trainer thread owns it (and the model's weights),
// except version(), which any thread may read.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/policy_model.h"
#include "learner_server/adamw.h"
#include "learner_server/group_queue.h"
#include "learner_server/lr_schedule.h"
#include "learner_server/policy_loss.h"
#include "learner_server/sharded_adamw.h"

namespace asympo::learner {

// Where each new version of the weights goes (the weight broadcaster in the
// daemon). Publish is called on the trainer thread after every step; it
// must not keep references to the model's tensors beyond the call.
class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  virtual void Publish(uint64_t version, const PolicyModel& model) = 0;
};

// Keeps a copy of the latest published weights, for tests and for an
// in-process rollout.
class InProcessPublisher : public WeightPublisher {
 public:
  void Publish(uint64_t version, const PolicyModel& model) override;
  uint64_t version() const { return version_; }
  int64_t publishes() const { return publishes_; }
  const std::vector<std::pair<std::string, at::Tensor>>& weights() const { return weights_; }

 private:
  uint64_t version_ = 0;
  int64_t publishes_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> weights_;
};

struct TrainerOptions {
  PolicyLossOptions loss;
  LrScheduleOptions lr;
  AdamWOptions adamw;
  // Clip the global gradient norm to this value; <= 0 disables clipping.
  double max_grad_norm = 1.0;
  // Padded tokens (sequences x longest sequence) per micro-batch. A group
  // larger than the budget forms a micro-batch of its own.
  int64_t micro_batch_tokens = 16384;
  // Rows of logits computed at once by the chunked log-prob path.
  int64_t logprob_chunk_rows = 1024;
  int64_t pad_token_id = 0;
  // Fault injection, for tests and drills only: the Nth call of Step()
  // (1-based, counted by this trainer) gets a NaN loss
  // (nonfinite_loss_steps) or a c10::Error thrown after its first
  // micro-batch's backward pass (exception_steps).
  std::vector<int64_t> fault_nonfinite_loss_steps;
  std::vector<int64_t> fault_exception_steps;
};

// Why a step was skipped, the label of asympo_learner_steps_skipped_total.
inline constexpr char kSkipNonFiniteLoss[] = "nonfinite_loss";
inline constexpr char kSkipNonFiniteGradient[] = "nonfinite_gradient";
inline constexpr char kSkipInvalidBatch[] = "invalid_batch";
inline constexpr char kSkipOutOfMemory[] = "out_of_memory";
inline constexpr char kSkipTorchError[] = "torch_error";
// Every group of the step made it non-finite by its rewards (StepResult::
// dropped, trainer_isolation.cc): the sources' fault, not the learner's.
inline constexpr char kSkipPoisonedGroups[] = "poisoned_groups";

// The reason carried by a status from Trainer::Step (one of the kSkip*
// names; "error" for a status without one).
std::string StepSkipReason(const absl::Status& status);
// `status` carrying `reason` (one of the kSkip* names) for StepSkipReason.
absl::Status WithStepSkipReason(absl::Status status, absl::string_view reason);

absl::Status ValidateTrainerOptions(const TrainerOptions& options);

// A step's totals over all its groups (what each micro-batch's loss, and
// each data-parallel rank's, divides by).
StepTotals StepTotalsOf(const std::vector<QueuedGroup>& groups);

struct StepResult {
  uint64_t version = 0;         // after the step
  LossDiagnostics diagnostics;  // pooled over the step's micro-batches
  double grad_norm = 0;         // before clipping
  double learning_rate = 0;
  int64_t micro_batches = 0;
  int64_t tokens = 0;  // prompt + response tokens processed
  double seconds = 0;
  std::vector<uint64_t> staleness;  // per trained group: version at use - arrival
  // Indices (into Step's groups) of the groups dropped from the step because
  // each alone made the loss or the gradient non-finite (a poisoned group);
  // the step trained on the others.
  std::vector<size_t> dropped;
  std::vector<std::string> dropped_sources;  // their QueuedGroup::source, in order
};

// One micro-batch as tensors (trainer.cc).
struct MicroBatch;

// Sums a step across data-parallel ranks (DataParallel). Each call is a
// collective: every rank makes the same calls in the same order.
class StepReducer {
 public:
  virtual ~StepReducer() = default;
  // Sums `values` element-wise across ranks, in place.
  virtual absl::Status SumValues(std::vector<double>* values) = 0;
  // Sums the tensors across ranks, in place (same shapes on every rank).
  virtual absl::Status SumGradients(const std::vector<at::Tensor>& gradients) = 0;
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
  // to blame, or every group to blame: kSkipPoisonedGroups; an exception
  // from LibTorch) the weights
  // and the optimizer are unchanged, the gradients are cleared, the version
  // does not move, and the status carries its StepSkipReason. Never throws.
  absl::StatusOr<StepResult> Step(std::vector<QueuedGroup> groups);

  // One data-parallel step: this rank's `shard` of a step whose totals over
  // all ranks are `totals` (shards may be empty). The gradients and the
  // diagnostics are summed across ranks by `reducer`, then every rank
  // clips and steps alike, so the weights stay equal to a single process
  // training all the groups. A failure on any rank skips the step on every
  // rank (with a failing rank's reason), except that each rank first drops
  // the groups of its shard that are non-finite by their rewards, as Step
  // does (StepResult::dropped indexes `shard`; the step's totals still
  // count them); a step whose every group was dropped is skipped as
  // kSkipPoisonedGroups. A failed collective returns the
  // reducer's status as it is: the job cannot go on (IsRankFailure).
  // `staleness` covers this rank's shard only; `seconds` includes the
  // exchange.
  absl::StatusOr<StepResult> StepShard(const std::vector<QueuedGroup>& shard,
                                       const StepTotals& totals, StepReducer* reducer);

  // The first half of Step: zeroes and then accumulates the step's
  // gradients in the model's parameters, micro-batch by micro-batch, and
  // returns the pooled diagnostics (version, learning rate and grad norm
  // unset). Leaves the weights and the optimizer untouched. Never throws.
  absl::StatusOr<StepResult> ComputeGradients(const std::vector<QueuedGroup>& groups);

  // ZeRO-1: from now on StepShard keeps 1/world_size of the AdamW moments
  // on this rank (ShardedAdamW over `collectives`, which must outlive the
  // trainer). Collective: rank 0's optimizer state (restored from a
  // checkpoint, say) is split across the ranks, and optimizer() holds no
  // moments afterwards.
  absl::Status ShardOptimizer(ShardCollectives* collectives);
  // Collective, with a sharded optimizer: assembles the whole state in rank
  // 0's optimizer() for a checkpoint; ReleaseOptimizerState frees it again.
  absl::Status GatherOptimizerState();
  void ReleaseOptimizerState();
  // Null unless ShardOptimizer was called.
  const ShardedAdamW* sharded_optimizer() const { return sharded_.get(); }

  // The policy version: optimizer steps applied. Any thread.
  uint64_t version() const { return version_.load(); }
  // For restoring from a checkpoint.
  void set_version(uint64_t version) { version_ = version; }
  AdamW& optimizer() { return optimizer_; }
  const TrainerOptions& options() const { return options_; }
  const PolicyLoss& loss() const { return loss_; }
  PolicyModel& model() { return *model_; }

 private:
  Trainer(TrainerOptions options, PolicyLoss loss, PolicyModel* model, WeightPublisher* publisher);
  // Runs `step` under GuardTorch; on error clears the gradients and gives
  // the status its StepSkipReason.
  absl::StatusOr<StepResult> Guarded(absl::string_view what,
                                     const std::function<absl::StatusOr<StepResult>()>& step);
  // Step and ComputeGradients without the exception guard.
  absl::StatusOr<StepResult> StepUnguarded(const std::vector<QueuedGroup>& groups);
  // Step's second try after `failure` (trainer_isolation.cc); `failure`
  // itself unless it is a non-finite loss or gradient with poison to blame.
  absl::StatusOr<StepResult> StepWithoutPoisonedGroups(const std::vector<QueuedGroup>& groups,
                                                       const absl::Status& failure);
  // StepShard's local half after `failure`: this rank's shard without its
  // poisoned groups (the step's totals unchanged; possibly no group left).
  absl::StatusOr<StepResult> ShardWithoutPoisonedGroups(const std::vector<QueuedGroup>& shard,
                                                        const StepTotals& totals,
                                                        std::vector<double>* sums,
                                                        const absl::Status& failure);
  // The indices of `groups` that are non-finite by their rewards (each
  // tried alone, then with its rewards' signs), or `failure` when that is not
  // a non-finite loss or gradient, or a group is non-finite for another
  // reason (the model's) or fails otherwise.
  absl::StatusOr<std::vector<size_t>> PoisonedGroups(const std::vector<QueuedGroup>& groups,
                                                     const absl::Status& failure);
  // OK when `group` alone gives a finite loss and gradient; leaves no
  // gradient behind.
  absl::Status TryAlone(const QueuedGroup& group);
  // Also stores the DiagnosticsPool's sums in `sums` when given (for
  // ReduceShard).
  absl::StatusOr<StepResult> ComputeGradientsUnguarded(const std::vector<QueuedGroup>& groups,
                                                       const StepTotals& totals,
                                                       std::vector<double>* sums = nullptr);
  // The second half of a step: clips, steps AdamW, bumps and publishes the
  // version. `result` comes from ComputeGradients. With `stepped` (a
  // sharded optimizer; per parameter, whether any rank has a gradient for
  // it) the gradients are still this rank's own and ShardedAdamW reduces
  // them.
  absl::StatusOr<StepResult> ApplyUnguarded(StepResult result,
                                            const std::vector<QueuedGroup>& groups,
                                            const std::vector<bool>* stepped = nullptr);
  // StepShard's exchange: sums the diagnostics, the failures and (unless
  // the optimizer is sharded) the gradients across ranks; sets `stepped`.
  absl::StatusOr<StepResult> ReduceShard(absl::StatusOr<StepResult> local,
                                         const std::vector<double>& sums, StepReducer* reducer,
                                         std::vector<bool>* stepped);
  // The sharded optimizer's step: reduce-scatter, clip, AdamW, all-gather.
  // Returns the norm before clipping.
  absl::StatusOr<double> StepShardedOptimizer(double lr, const std::vector<bool>& stepped);
  // Counts a step attempt and sets this step's injected faults.
  void ArmFaults();
  // Forward, loss and backward of one micro-batch; adds to the gradients.
  absl::StatusOr<LossDiagnostics> BackwardMicroBatch(const MicroBatch& batch,
                                                     const StepTotals& totals);
  // Clips the gradients to max_grad_norm; returns the norm before clipping.
  absl::StatusOr<double> ClipGradients();

  TrainerOptions options_;
  PolicyLoss loss_;
  PolicyModel* model_;
  WeightPublisher* publisher_;
  AdamW optimizer_;
  std::unique_ptr<ShardedAdamW> sharded_;
  std::atomic<uint64_t> version_{0};
  int64_t step_calls_ = 0;                              // for fault injection
  bool inject_nan_ = false, inject_exception_ = false;  // this step's faults
};

}  // namespace asympo::learner
