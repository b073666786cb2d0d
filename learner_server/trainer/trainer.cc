#include "learner_server/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "common/batch_validation.h"
#include "common/status_macros.h"
#include "learner_server/loss/token_logprobs.h"

namespace asympo::learner {
namespace {

bool AllRewardsEqual(const v1::PromptGroup& g) {
  for (const v1::Response& r : g.responses()) {
    if (r.reward() != g.responses(0).reward()) return false;
  }
  return true;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The factor that clips a gradient of norm `norm` to `max_norm` (<= 0: no
// clipping).
double ClipScale(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

StepFailure NonFiniteLoss(absl::string_view what) {
  return {absl::InternalError(absl::StrCat(what, " not finite; the step was skipped")),
          SkipReason::kNonFiniteLoss};
}

// The loss's inputs for micro-batch `mb` on `dev`, with `logp` (M,) its
// response tokens' log-probs.
LossInputs LossInputsOf(const MicroBatch& mb, const at::Tensor& logp, const StepTotals& totals,
                        const at::Device& dev) {
  LossInputs in;
  in.mask = mb.response_mask.to(dev);
  in.token_logprobs = at::zeros({mb.responses, mb.longest_response}, logp.options())
                          .masked_scatter(in.mask, logp);  // (N, R)
  in.rewards = mb.rewards.to(dev);
  in.group_index = mb.group_index.to(dev);
  in.num_groups = mb.groups;
  if (mb.behavior.defined()) in.behavior_logprobs = mb.behavior.to(dev);
  in.step_totals = totals;
  return in;
}

std::unique_ptr<MicroBatchLayout> MakeLayout(const TrainerOptions& o, int64_t vocab_size,
                                             bool behavior_logprobs) {
  const PaddedLayoutOptions layout{o.micro_batch_tokens, vocab_size, o.pad_token_id,
                                   behavior_logprobs};
  if (o.pack_sequences) return std::make_unique<PackedLayout>(layout);
  return std::make_unique<PaddedLayout>(layout);
}

}  // namespace

absl::Status ValidateTrainerOptions(const TrainerOptions& o) {
  ASYMPO_RETURN_IF_ERROR(PolicyLoss::Create(o.loss).status());
  ASYMPO_RETURN_IF_ERROR(ValidateLrSchedule(o.lr));
  ASYMPO_RETURN_IF_ERROR(ValidateAdamWOptions(o.adamw));
  if (!std::isfinite(o.max_grad_norm)) {
    return absl::InvalidArgumentError("max_grad_norm must be finite (<= 0 disables clipping)");
  }
  if (o.micro_batch_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch_tokens is ", o.micro_batch_tokens, "; it must be positive"));
  }
  if (o.logprob_chunk_rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprob_chunk_rows is ", o.logprob_chunk_rows, "; it must be positive"));
  }
  if (o.publish_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("publish_every is ", o.publish_every, "; it must be >= 0 (0: none)"));
  }
  return absl::OkStatus();
}

StepTotals StepTotalsOf(const std::vector<QueuedGroup>& groups) {
  StepTotals totals;
  for (const QueuedGroup& q : groups) {
    const int64_t n = q.group.responses_size();
    totals.groups += 1;
    totals.responses += n;
    for (const v1::Response& r : q.group.responses()) totals.tokens += GeneratedTokens(r);
    if (AllRewardsEqual(q.group)) totals.degenerate_responses += n;
  }
  return totals;
}

std::vector<uint64_t> StalenessOf(const std::vector<QueuedGroup>& groups, uint64_t version) {
  std::vector<uint64_t> staleness;
  for (const QueuedGroup& q : groups) staleness.push_back(version - q.arrival_version);
  return staleness;
}

Trainer::Trainer(TrainerOptions options, PolicyLoss loss, PolicyModel* model,
                 WeightPublisher* publisher)
    : options_(std::move(options)),
      loss_(std::move(loss)),
      model_(model),
      publisher_(publisher),
      layout_(MakeLayout(options_, model->config().vocab_size, loss_.needs_behavior_logprobs())),
      faults_(options_.fault_nonfinite_loss_steps, options_.fault_exception_steps),
      optimizer_(model->parameters(), options_.adamw) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options, PolicyModel* model,
                                                         WeightPublisher* publisher) {
  ASYMPO_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  ASYMPO_ASSIGN_OR_RETURN(PolicyLoss loss, PolicyLoss::Create(options.loss));
  return std::unique_ptr<Trainer>(
      new Trainer(std::move(options), std::move(loss), model, publisher));
}

StepOr<StepResult> Trainer::Step(std::vector<QueuedGroup> groups) {
  faults_.Arm();
  const auto start = std::chrono::steady_clock::now();
  StepOr<StepResult> result = Guarded("training step", [&] { return StepUnguarded(groups); });
  if (!result.ok()) result = StepWithoutPoisonedGroups(groups, result.failure());
  if (result.ok()) result->seconds = SecondsSince(start);
  return result;
}

StepOr<StepResult> Trainer::StepUnguarded(const std::vector<QueuedGroup>& groups) {
  if (groups.empty()) return absl::InvalidArgumentError("a step needs at least one group");
  // Lay out, forward and loss, backward.
  StepOr<Accumulated> local = Accumulate(groups, StepTotalsOf(groups));
  if (!local.ok()) return local.failure();
  StepResult result = ResultOf(*local);
  result.staleness = StalenessOf(groups, version());
  // Reduce, clip, update, publish.
  return Update(std::move(result), Stepped());
}

StepOr<StepResult> Trainer::StepShard(const std::vector<QueuedGroup>& shard,
                                      const StepTotals& totals, StepReducer* reducer) {
  faults_.Arm();
  const auto start = std::chrono::steady_clock::now();
  // Lay out, forward and loss, backward: this rank's share.
  StepOr<Accumulated> local =
      Guarded("computing gradients", [&] { return Accumulate(shard, totals); });
  // In lockstep (full sharding) a rank cannot try its groups alone: the
  // others would wait for its passes.
  if (!local.ok() && !stepper_->lockstep()) {
    local = ShardWithoutPoisonedGroups(shard, totals, local.failure());
  }
  // Reduce across the ranks (the gradients too, unless the optimizer does).
  StepExchange exchange = ExchangeOf(local);
  StepOr<StepResult> reduced = Reduce(local, exchange, *reducer);
  if (!reduced.ok()) {
    optimizer_.ZeroGrad();
    return reduced;
  }
  // Clip, update, publish.
  std::vector<bool> stepped;
  for (const int64_t ranks : exchange.has_gradient) stepped.push_back(ranks != 0);
  StepOr<StepResult> step =
      Guarded("training step", [&] { return Update(*std::move(reduced), stepped); });
  if (step.ok()) step->seconds = SecondsSince(start);  // the exchange included
  return step;
}

StepOr<StepResult> Trainer::ComputeGradients(const std::vector<QueuedGroup>& groups) {
  if (groups.empty()) return absl::InvalidArgumentError("a step needs at least one group");
  StepOr<Accumulated> local =
      Guarded("computing gradients", [&] { return Accumulate(groups, StepTotalsOf(groups)); });
  if (!local.ok()) return local.failure();
  return ResultOf(*local);
}

StepOr<Trainer::Accumulated> Trainer::Accumulate(const std::vector<QueuedGroup>& groups,
                                                 const StepTotals& totals) {
  Accumulated local;
  for (const QueuedGroup& q : groups) local.tokens += q.tokens;
  optimizer_.ZeroGrad();
  ASYMPO_RETURN_IF_ERROR(stepper_->BeginStep());
  const std::vector<std::vector<const QueuedGroup*>> micro = layout_->Split(groups);
  if (stepper_->lockstep()) return AccumulateInLockstep(micro, totals, std::move(local));
  for (const std::vector<const QueuedGroup*>& groups_of_batch : micro) {
    ASYMPO_ASSIGN_OR_RETURN(const MicroBatch batch, layout_->Build(groups_of_batch));
    StepOr<LossOutput> out = LossOf(batch, Hidden(batch), totals);
    if (!out.ok()) return out.failure();
    out->loss.backward();
    faults_.AfterBackward();
    local.diagnostics.Add(out->diagnostics);
    ++local.micro_batches;
  }
  return local;
}

StepOr<Trainer::Accumulated> Trainer::AccumulateInLockstep(
    const std::vector<std::vector<const QueuedGroup*>>& micro, const StepTotals& totals,
    Accumulated local) {
  ASYMPO_ASSIGN_OR_RETURN(const int64_t count,
                          stepper_->MostMicroBatches(static_cast<int64_t>(micro.size())));
  std::optional<StepFailure> failure;
  for (int64_t i = 0; i < count; ++i) {
    if (failure.has_value() || i >= static_cast<int64_t>(micro.size())) {
      IdlePass();
      continue;
    }
    absl::StatusOr<MicroBatch> batch = layout_->Build(micro[static_cast<size_t>(i)]);
    if (!batch.ok()) {
      failure = StepFailure{batch.status(), SkipReasonOfCode(batch.status().code())};
      IdlePass();
      continue;
    }
    const at::Tensor hidden = Hidden(*batch);
    StepOr<LossOutput> out = LossOf(*batch, hidden, totals);
    if (!out.ok()) {
      // The other ranks run this micro-batch's backward: so does this one,
      // of nothing.
      failure = out.failure();
      (hidden.sum() * 0).backward();
      continue;
    }
    out->loss.backward();
    faults_.AfterBackward();
    local.diagnostics.Add(out->diagnostics);
    ++local.micro_batches;
  }
  if (failure.has_value()) return *failure;
  return local;
}

void Trainer::IdlePass() {
  const at::Device dev = model_->options().device;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(dev);
  const at::Tensor hidden = model_->Forward(at::zeros({1, 1}, longs), at::zeros({1, 1}, longs),
                                            at::ones({1, 1}, longs.dtype(at::kBool)));
  (hidden.sum() * 0).backward();
}

at::Tensor Trainer::Hidden(const MicroBatch& mb) {
  // The batch is laid out on the host and goes to the model's device once.
  const at::Device dev = model_->options().device;
  return model_->Forward(
      mb.ids.to(dev), mb.positions.to(dev), mb.key_mask.to(dev), nullptr,
      mb.segments.defined() ? mb.segments.to(dev) : at::Tensor());  // (rows, T, H)
}

StepOr<LossOutput> Trainer::LossOf(const MicroBatch& mb, const at::Tensor& hidden,
                                   const StepTotals& totals) {
  const at::Device dev = model_->options().device;
  const at::Tensor picked =
      hidden.reshape({-1, hidden.size(2)})
          .index_select(0, at::tensor(mb.hidden_rows, at::kLong).to(dev));  // (M, H)
  // Log-probs in float32 whatever the compute dtype; the float32 master
  // lm_head gets a float32 gradient.
  ASYMPO_ASSIGN_OR_RETURN(at::Tensor logp,
                          ChunkedTokenLogProbs(picked, model_->lm_head_weight(),
                                               at::tensor(mb.targets, at::kLong).to(dev),
                                               options_.logprob_chunk_rows));  // (M,)
  // Overflowing weights or activations, not bad data: a non-finite loss.
  if (!at::isfinite(logp).all().item<bool>()) return NonFiniteLoss("token log-probs are");
  // An error keeps its code, which gives its reason (INVALID_ARGUMENT: bad
  // data; RESOURCE_EXHAUSTED: out of memory).
  StepTotals weighed = totals;
  weighed.step_groups = options_.step_groups;
  absl::StatusOr<LossOutput> out = loss_.Compute(LossInputsOf(mb, logp, weighed, dev));
  if (!out.ok()) return out.status();
  faults_.AfterLoss(*out);
  if (!std::isfinite(out->diagnostics.loss)) return NonFiniteLoss("the loss is");
  return *std::move(out);
}

StepExchange Trainer::ExchangeOf(const StepOr<Accumulated>& local) const {
  StepExchange e;
  if (local.ok()) {
    e.diagnostics = local->diagnostics;
    e.tokens = local->tokens;
    e.micro_batches = local->micro_batches;
    if (local->diagnostics.groups > 0) {
      e.gpg_alpha = local->diagnostics.gpg_alpha;
      e.ranks_with_groups = 1;
    }
  } else {
    e.failures[static_cast<size_t>(local.reason())] = 1;
  }
  for (const bool has : Stepped()) e.has_gradient.push_back(has ? 1 : 0);
  return e;
}

StepOr<StepResult> Trainer::Reduce(const StepOr<Accumulated>& local, StepExchange& exchange,
                                   StepReducer& reducer) {
  ASYMPO_RETURN_IF_ERROR(SumAcrossRanks(reducer, exchange));
  if (const std::optional<SkipReason> reason = exchange.failure()) {
    if (!local.ok()) return local.failure();
    return StepFailure{
        absl::InternalError(absl::StrCat(
            exchange.failures[static_cast<size_t>(*reason)], " other rank(s) failed this step (",
            SkipReasonLabel(*reason), "); it was skipped on every rank")),
        *reason};
  }
  if (exchange.ranks_with_groups == 0) {  // every rank dropped all its groups as poisoned
    return StepFailure{
        absl::InternalError("every group of the step, on every rank, made the loss or the "
                            "gradient non-finite by its rewards; the step was skipped"),
        SkipReason::kPoisonedGroups};
  }
  if (!stepper_->reduces_gradients()) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> gradients;
    const std::vector<at::Tensor> params = model_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (exchange.has_gradient[i] == 0) continue;  // no rank has one: AdamW skips it
      at::Tensor p = params[i];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      gradients.push_back(p.grad());
    }
    if (!gradients.empty()) ASYMPO_RETURN_IF_ERROR(reducer.SumGradients(gradients));
  }
  StepResult result = ResultOf(*local);
  result.diagnostics = exchange.Pooled();
  result.tokens = exchange.tokens;
  result.micro_batches = exchange.micro_batches;
  return result;
}

StepOr<StepResult> Trainer::Update(StepResult result, const std::vector<bool>& stepped) {
  // Reduce (ZeRO-1: reduce-scatter) and measure the gradient.
  ASYMPO_ASSIGN_OR_RETURN(result.grad_norm, stepper_->ReduceGradients());
  if (!std::isfinite(result.grad_norm)) {
    stepper_->DropGradients();
    return NonFiniteGradient();
  }
  // Clip and update. The commit point: nothing before it changed the
  // weights or the moments; a failure past it is a failed collective
  // (sharded), which ends the job.
  const double scale = ClipScale(result.grad_norm, options_.max_grad_norm);
  result.learning_rate = LearningRate(options_.lr, static_cast<int64_t>(version()));
  ASYMPO_RETURN_IF_ERROR(stepper_->Apply(result.learning_rate, scale, stepped));
  // Publish.
  ASYMPO_ASSIGN_OR_RETURN(result.version, Publish());
  return result;
}

absl::StatusOr<uint64_t> Trainer::Publish() {
  const uint64_t version = version_.fetch_add(1) + 1;
  const auto every = static_cast<uint64_t>(options_.publish_every);
  if (every == 0 || version % every != 0) return version;  // not read, on any rank
  // Fully sharded weights are gathered on rank 0 a unit at a time.
  const WeightParts parts = [this](const StagePart& stage) { return VisitWeightParts(stage); };
  if (publisher_ != nullptr) {
    ASYMPO_RETURN_IF_ERROR(publisher_->Publish(version, *model_, parts));
  } else {
    ASYMPO_RETURN_IF_ERROR(parts(StageNothing));
  }
  return version;
}

absl::Status Trainer::VisitWeightParts(const StagePart& stage) {
  if (full_ != nullptr) return full_->VisitUnits(stage);
  return WholeWeights(*model_)(stage);
}

WeightParts WholeWeights(const PolicyModel& model) {
  std::vector<size_t> all(model.named_parameters().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return [all](const StagePart& stage) { return stage(all); };
}

StepResult Trainer::ResultOf(const Accumulated& local) {
  StepResult result;
  result.diagnostics = local.diagnostics.Pooled();
  result.tokens = local.tokens;
  result.micro_batches = local.micro_batches;
  result.dropped = local.dropped;
  result.dropped_sources = local.dropped_sources;
  return result;
}

std::vector<bool> Trainer::Stepped() const {
  return stepper_->LocalGradients(model_->parameters());
}

StepFailure Trainer::NonFiniteGradient() {
  return {absl::InternalError("the gradient is not finite; the step was skipped"),
          SkipReason::kNonFiniteGradient};
}

absl::Status Trainer::ShardOptimizer(ShardCollectives* collectives) {
  auto sharded = std::make_unique<ShardedAdamW>(model_->parameters(), options_.adamw, collectives);
  ASYMPO_RETURN_IF_ERROR(sharded->ScatterState(optimizer_));
  sharded_ = std::move(sharded);
  stepper_ = sharded_.get();
  DropWholeMoments();
  return absl::OkStatus();
}

void Trainer::DropWholeMoments() {
  // Cannot fail: an empty state matches any parameters.
  optimizer_.LoadState({}, optimizer_.step_count()).IgnoreError();
}

absl::Status Trainer::ShardFully(ShardCollectives* collectives) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<FullShard> shard,
                          FullShard::Create(model_, options_.adamw, collectives, optimizer_));
  full_ = shard.get();
  sharded_ = std::move(shard);
  stepper_ = sharded_.get();
  DropWholeMoments();
  return absl::OkStatus();
}

}  // namespace asympo::learner
