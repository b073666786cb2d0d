#include "learner_server/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"
#include "learner_server/token_logprobs.h"

namespace asympo::learner {
namespace {

// Pools per-micro-batch diagnostics into the step's (see LossDiagnostics).
class DiagnosticsPool {
 public:
  void Add(const LossDiagnostics& d) {
    loss_ += d.loss;
    mass_ += d.group_positive_mass.sum().item<double>();
    pos_ += (d.group_positive_mass * d.group_s_pos).sum().item<double>();
    neg_ += (d.group_positive_mass * d.group_s_neg).sum().item<double>();
    imbalance_ += d.group_imbalance.sum().item<double>();
    const double tokens = static_cast<double>(d.tokens);
    const double responses = static_cast<double>(d.responses);
    clip_low_ += d.clip_low_fraction * tokens;
    clip_high_ += d.clip_high_fraction * tokens;
    nll_ += d.mean_nll * tokens;
    length_ += d.mean_response_length * responses;
    reward_ += d.reward_mean * responses;
    reward_sq_ += (d.reward_std * d.reward_std + d.reward_mean * d.reward_mean) * responses;
    degenerate_ += d.degenerate_group_fraction * static_cast<double>(d.groups);
    gpg_alpha_ = d.gpg_alpha;
    groups_ += d.groups;
    responses_ += d.responses;
    tokens_ += d.tokens;
  }

  // The sums, for adding up across data-parallel ranks (SetSums undoes it).
  static constexpr size_t kSums = 15;
  std::vector<double> Sums() const {
    return {loss_,
            mass_,
            pos_,
            neg_,
            imbalance_,
            clip_low_,
            clip_high_,
            nll_,
            length_,
            reward_,
            reward_sq_,
            degenerate_,
            static_cast<double>(groups_),
            static_cast<double>(responses_),
            static_cast<double>(tokens_)};
  }
  void SetSums(const double* v, double gpg_alpha) {
    loss_ = v[0], mass_ = v[1], pos_ = v[2], neg_ = v[3], imbalance_ = v[4];
    clip_low_ = v[5], clip_high_ = v[6], nll_ = v[7], length_ = v[8], reward_ = v[9];
    reward_sq_ = v[10], degenerate_ = v[11];
    groups_ = static_cast<int64_t>(v[12]);
    responses_ = static_cast<int64_t>(v[13]);
    tokens_ = static_cast<int64_t>(v[14]);
    gpg_alpha_ = gpg_alpha;
  }

  LossDiagnostics Result() const {
    LossDiagnostics d;
    d.loss = loss_;
    if (mass_ > 0) {
      d.s_pos = pos_ / mass_;
      d.s_neg = neg_ / mass_;
      d.naive_ratio = d.s_pos > 0 ? d.s_neg / d.s_pos : 0.0;
    }
    const double g = static_cast<double>(std::max<int64_t>(groups_, 1));
    const double r = static_cast<double>(std::max<int64_t>(responses_, 1));
    const double t = static_cast<double>(std::max<int64_t>(tokens_, 1));
    d.imbalance = imbalance_ / g;
    d.clip_low_fraction = clip_low_ / t;
    d.clip_high_fraction = clip_high_ / t;
    d.mean_nll = nll_ / t;
    d.mean_response_length = length_ / r;
    d.reward_mean = reward_ / r;
    d.reward_std = std::sqrt(std::max(0.0, reward_sq_ / r - d.reward_mean * d.reward_mean));
    d.degenerate_group_fraction = degenerate_ / g;
    d.gpg_alpha = gpg_alpha_;
    d.groups = groups_;
    d.responses = responses_;
    d.tokens = tokens_;
    return d;
  }

 private:
  double loss_ = 0, mass_ = 0, pos_ = 0, neg_ = 0, imbalance_ = 0, clip_low_ = 0, clip_high_ = 0,
         nll_ = 0, length_ = 0, reward_ = 0, reward_sq_ = 0, degenerate_ = 0, gpg_alpha_ = 1;
  int64_t groups_ = 0, responses_ = 0, tokens_ = 0;
};

bool AllRewardsEqual(const v1::PromptGroup& g) {
  for (const v1::Response& r : g.responses()) {
    if (r.reward() != g.responses(0).reward()) return false;
  }
  return true;
}

// Longest prompt + response of a group.
int64_t LongestSequence(const v1::PromptGroup& g) {
  int64_t longest = 0;
  for (const v1::Response& r : g.responses()) {
    longest = std::max<int64_t>(longest, g.prompt_tokens_size() + r.tokens_size());
  }
  return longest;
}

// Splits groups, in order, into micro-batches whose padded size
// (sequences x longest) stays within `budget` (a lone larger group excepted).
std::vector<std::vector<const QueuedGroup*>> Pack(const std::vector<QueuedGroup>& groups,
                                                  int64_t budget) {
  std::vector<std::vector<const QueuedGroup*>> out;
  int64_t rows = 0, longest = 0;
  for (const QueuedGroup& q : groups) {
    const int64_t n = q.group.responses_size();
    const int64_t len = LongestSequence(q.group);
    if (!out.empty() && rows > 0 && (rows + n) * std::max(longest, len) <= budget) {
      rows += n;
      longest = std::max(longest, len);
      out.back().push_back(&q);
    } else {
      out.push_back({&q});
      rows = n;
      longest = len;
    }
  }
  return out;
}

}  // namespace

void InProcessPublisher::Publish(uint64_t version, const PolicyModel& model) {
  at::NoGradGuard no_grad;
  weights_.clear();
  for (const auto& [name, t] : model.named_parameters()) weights_.emplace_back(name, t.clone());
  version_ = version;
  ++publishes_;
}

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
  return absl::OkStatus();
}

Trainer::Trainer(TrainerOptions options, PolicyLoss loss, PolicyModel* model,
                 WeightPublisher* publisher)
    : options_(std::move(options)),
      loss_(std::move(loss)),
      model_(model),
      publisher_(publisher),
      optimizer_(model->parameters(), options_.adamw) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options, PolicyModel* model,
                                                         WeightPublisher* publisher) {
  ASYMPO_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  ASYMPO_ASSIGN_OR_RETURN(PolicyLoss loss, PolicyLoss::Create(options.loss));
  return std::unique_ptr<Trainer>(
      new Trainer(std::move(options), std::move(loss), model, publisher));
}

namespace {

constexpr char kSkipReasonUrl[] = "type.asympo/learner.skip_reason";

// `status` with the skip reason attached.
absl::Status WithReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kSkipReasonUrl, absl::Cord(reason));
  return status;
}

// A reason for statuses that did not get one where they were made (only the
// non-finite ones do), from their code: out of memory, bad input, or any
// other LibTorch error.
absl::Status WithDefaultReason(absl::Status status) {
  if (status.GetPayload(kSkipReasonUrl).has_value()) return status;
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      return WithReason(std::move(status), kSkipOutOfMemory);
    case absl::StatusCode::kInvalidArgument:
      return WithReason(std::move(status), kSkipInvalidBatch);
    default:
      return WithReason(std::move(status), kSkipTorchError);
  }
}

bool Contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::Status WithStepSkipReason(absl::Status status, absl::string_view reason) {
  return WithReason(std::move(status), reason);
}

std::string StepSkipReason(const absl::Status& status) {
  const auto reason = status.GetPayload(kSkipReasonUrl);
  return reason.has_value() ? std::string(*reason) : std::string("error");
}

// One micro-batch of whole groups, padded to its longest sequence. Per
// response: prompt + response ids; the hidden state at position P - 1 + j
// predicts response token j.
struct MicroBatch {
  int64_t rows = 0;              // N: responses
  int64_t longest = 0;           // T: longest prompt + response
  int64_t longest_response = 0;  // R
  int64_t groups = 0;
  at::Tensor ids;                    // (N, T) int64, padded
  at::Tensor key_mask;               // (N, T) bool, true on real tokens
  at::Tensor response_mask;          // (N, R) bool
  at::Tensor rewards;                // (N,) float
  at::Tensor group_index;            // (N,) int64 in [0, groups)
  at::Tensor behavior;               // (N, R) float; grpo only
  std::vector<int64_t> hidden_rows;  // (M,) flat N*T index of each response token's predictor
  std::vector<int64_t> targets;      // (M,) the response tokens
};

namespace {

// Lays `groups` out as a MicroBatch. INVALID_ARGUMENT for a token outside
// the vocabulary.
absl::StatusOr<MicroBatch> BuildMicroBatch(const std::vector<const QueuedGroup*>& groups,
                                           int64_t vocab, bool grpo, int64_t pad_token_id) {
  MicroBatch mb;
  mb.groups = static_cast<int64_t>(groups.size());
  for (const QueuedGroup* q : groups) {
    mb.rows += q->group.responses_size();
    mb.longest = std::max(mb.longest, LongestSequence(q->group));
    for (const v1::Response& r : q->group.responses()) {
      mb.longest_response = std::max<int64_t>(mb.longest_response, r.tokens_size());
    }
  }
  const int64_t n = mb.rows, t = mb.longest, rl = mb.longest_response;
  mb.ids = at::full({n, t}, pad_token_id, at::kLong);
  mb.key_mask = at::zeros({n, t}, at::kBool);
  mb.response_mask = at::zeros({n, rl}, at::kBool);
  mb.rewards = at::empty({n}, at::kFloat);
  mb.group_index = at::empty({n}, at::kLong);
  if (grpo) mb.behavior = at::zeros({n, rl}, at::kFloat);
  auto ids = mb.ids.accessor<int64_t, 2>();
  auto keys = mb.key_mask.accessor<bool, 2>();
  auto resp = mb.response_mask.accessor<bool, 2>();
  auto rewards = mb.rewards.accessor<float, 1>();
  auto group_index = mb.group_index.accessor<int64_t, 1>();
  float* behavior = grpo ? mb.behavior.data_ptr<float>() : nullptr;
  int64_t i = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const v1::PromptGroup& pg = groups[g]->group;
    const int64_t p = pg.prompt_tokens_size();
    for (const v1::Response& r : pg.responses()) {
      for (int64_t k = 0; k < p; ++k) ids[i][k] = pg.prompt_tokens(static_cast<int>(k));
      for (int j = 0; j < r.tokens_size(); ++j) {
        const int32_t tok = r.tokens(j);
        if (tok < 0 || tok >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("token ", tok, " is outside the model's vocabulary of ", vocab));
        }
        ids[i][p + j] = tok;
        resp[i][j] = true;
        mb.hidden_rows.push_back(i * t + p - 1 + j);
        mb.targets.push_back(tok);
        if (grpo) behavior[i * rl + j] = r.behavior_logprobs(j);
      }
      for (int64_t k = 0; k < p + r.tokens_size(); ++k) keys[i][k] = true;
      rewards[i] = r.reward();
      group_index[i] = static_cast<int64_t>(g);
      ++i;
    }
  }
  return mb;
}

}  // namespace

StepTotals StepTotalsOf(const std::vector<QueuedGroup>& groups) {
  StepTotals totals;
  for (const QueuedGroup& q : groups) {
    const int64_t n = q.group.responses_size();
    totals.groups += 1;
    totals.responses += n;
    for (const v1::Response& r : q.group.responses()) totals.tokens += r.tokens_size();
    if (AllRewardsEqual(q.group)) totals.degenerate_responses += n;
  }
  return totals;
}

absl::StatusOr<StepResult> Trainer::Guarded(
    absl::string_view what, const std::function<absl::StatusOr<StepResult>()>& step) {
  absl::StatusOr<StepResult> result = GuardTorch(what, step);
  if (!result.ok()) {
    optimizer_.ZeroGrad();
    return WithDefaultReason(result.status());
  }
  return result;
}

void Trainer::ArmFaults() {
  ++step_calls_;
  inject_nan_ = Contains(options_.fault_nonfinite_loss_steps, step_calls_);
  inject_exception_ = Contains(options_.fault_exception_steps, step_calls_);
}

absl::StatusOr<StepResult> Trainer::Step(std::vector<QueuedGroup> groups) {
  ArmFaults();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<StepResult> result =
      Guarded("training step", [&] { return StepUnguarded(groups); });
  if (!result.ok()) result = StepWithoutPoisonedGroups(groups, result.status());
  if (result.ok()) result->seconds = SecondsSince(start);
  return result;
}

absl::StatusOr<StepResult> Trainer::StepUnguarded(const std::vector<QueuedGroup>& groups) {
  if (groups.empty()) return absl::InvalidArgumentError("a step needs at least one group");
  ASYMPO_ASSIGN_OR_RETURN(StepResult result,
                          ComputeGradientsUnguarded(groups, StepTotalsOf(groups)));
  return ApplyUnguarded(std::move(result), groups);
}

absl::StatusOr<StepResult> Trainer::ApplyUnguarded(StepResult result,
                                                   const std::vector<QueuedGroup>& groups,
                                                   const std::vector<bool>* stepped) {
  result.learning_rate = LearningRate(options_.lr, static_cast<int64_t>(version_.load()));
  double norm = 0;
  if (stepped != nullptr) {
    ASYMPO_ASSIGN_OR_RETURN(norm, StepShardedOptimizer(result.learning_rate, *stepped));
  } else {
    ASYMPO_ASSIGN_OR_RETURN(norm, ClipGradients());
    // The commit point: nothing before it changed the weights or the moments.
    optimizer_.Step(result.learning_rate);
  }
  optimizer_.ZeroGrad();
  const uint64_t version = version_.fetch_add(1) + 1;
  for (const QueuedGroup& q : groups) result.staleness.push_back(version - 1 - q.arrival_version);
  if (publisher_ != nullptr) publisher_->Publish(version, *model_);
  result.version = version;
  result.grad_norm = norm;
  return result;
}

absl::StatusOr<double> Trainer::StepShardedOptimizer(double lr, const std::vector<bool>& stepped) {
  ASYMPO_ASSIGN_OR_RETURN(const double norm, sharded_->ReduceGradients());
  optimizer_.ZeroGrad();  // the summed gradient is in the reduced chunk now
  if (!std::isfinite(norm)) {
    sharded_->DropGradients();
    return WithReason(absl::InternalError("the gradient is not finite; the step was skipped"),
                      kSkipNonFiniteGradient);
  }
  const double scale = options_.max_grad_norm > 0 && norm > options_.max_grad_norm
                           ? options_.max_grad_norm / (norm + 1e-6)
                           : 1.0;
  // The commit point: a failure past it is a failed collective, which ends
  // the job.
  ASYMPO_RETURN_IF_ERROR(sharded_->Apply(lr, scale, stepped));
  return norm;
}

absl::Status Trainer::ShardOptimizer(ShardCollectives* collectives) {
  sharded_ = std::make_unique<ShardedAdamW>(model_->parameters(), options_.adamw, collectives);
  ASYMPO_RETURN_IF_ERROR(sharded_->ScatterState(optimizer_));
  ReleaseOptimizerState();
  return absl::OkStatus();
}

absl::Status Trainer::GatherOptimizerState() {
  return sharded_ == nullptr ? absl::OkStatus() : sharded_->GatherState(&optimizer_);
}

void Trainer::ReleaseOptimizerState() {
  if (sharded_ == nullptr) return;
  // Cannot fail: an empty state matches any parameters.
  optimizer_.LoadState({}, sharded_->step_count()).IgnoreError();
}

absl::StatusOr<double> Trainer::ClipGradients() {
  // One host synchronisation for the whole norm, not one per parameter.
  std::vector<at::Tensor> squares;
  for (const at::Tensor& p : model_->parameters()) {
    if (p.grad().defined()) squares.push_back(p.grad().pow(2).sum().to(at::kDouble));
  }
  const double norm = squares.empty() ? 0.0 : std::sqrt(at::stack(squares).sum().item<double>());
  if (!std::isfinite(norm)) {
    return WithReason(absl::InternalError("the gradient is not finite; the step was skipped"),
                      kSkipNonFiniteGradient);
  }
  if (options_.max_grad_norm > 0 && norm > options_.max_grad_norm) {
    at::NoGradGuard no_grad;
    const double scale = options_.max_grad_norm / (norm + 1e-6);
    for (const at::Tensor& p : model_->parameters()) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  return norm;
}

absl::StatusOr<StepResult> Trainer::ComputeGradients(const std::vector<QueuedGroup>& groups) {
  if (groups.empty()) return absl::InvalidArgumentError("a step needs at least one group");
  return Guarded("computing gradients",
                 [&] { return ComputeGradientsUnguarded(groups, StepTotalsOf(groups)); });
}

absl::StatusOr<StepResult> Trainer::ComputeGradientsUnguarded(
    const std::vector<QueuedGroup>& groups, const StepTotals& totals, std::vector<double>* sums) {
  StepResult result;
  for (const QueuedGroup& q : groups) result.tokens += q.tokens;
  DiagnosticsPool pool;
  optimizer_.ZeroGrad();
  for (const auto& micro : Pack(groups, options_.micro_batch_tokens)) {
    ASYMPO_ASSIGN_OR_RETURN(
        const MicroBatch batch,
        BuildMicroBatch(micro, model_->config().vocab_size, loss_.needs_behavior_logprobs(),
                        options_.pad_token_id));
    ASYMPO_ASSIGN_OR_RETURN(LossDiagnostics diagnostics, BackwardMicroBatch(batch, totals));
    pool.Add(diagnostics);
    ++result.micro_batches;
    if (inject_exception_) TORCH_CHECK(false, "injected fault (--fault_exception_steps)");
  }
  result.diagnostics = pool.Result();
  if (sums != nullptr) *sums = pool.Sums();
  return result;
}

absl::StatusOr<LossDiagnostics> Trainer::BackwardMicroBatch(const MicroBatch& mb,
                                                            const StepTotals& totals) {
  // The batch is laid out on the host and goes to the model's device once.
  const at::Device dev = model_->options().device;
  const auto on = at::TensorOptions().dtype(at::kLong).device(dev);
  const at::Tensor positions =
      at::arange(mb.longest, on).unsqueeze(0).expand({mb.rows, mb.longest}).contiguous();
  const at::Tensor hidden =
      model_->Forward(mb.ids.to(dev), positions, mb.key_mask.to(dev));  // (N, T, H)
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
  if (!at::isfinite(logp).all().item<bool>()) {
    return WithReason(absl::InternalError("token log-probs are not finite; the step was skipped"),
                      kSkipNonFiniteLoss);
  }
  LossInputs in;
  in.mask = mb.response_mask.to(dev);
  in.token_logprobs = at::zeros({mb.rows, mb.longest_response}, logp.options())
                          .masked_scatter(in.mask, logp);  // (N, R)
  in.rewards = mb.rewards.to(dev);
  in.group_index = mb.group_index.to(dev);
  in.num_groups = mb.groups;
  if (mb.behavior.defined()) in.behavior_logprobs = mb.behavior.to(dev);
  in.step_totals = totals;
  // An error keeps its code, which WithDefaultReason turns into the reason
  // (INVALID_ARGUMENT: bad data; RESOURCE_EXHAUSTED: out of memory).
  absl::StatusOr<LossOutput> out = loss_.Compute(in);
  if (!out.ok()) return out.status();
  if (inject_nan_) {
    out->loss = out->loss * std::numeric_limits<double>::quiet_NaN();
    out->diagnostics.loss = std::numeric_limits<double>::quiet_NaN();
  }
  if (!std::isfinite(out->diagnostics.loss)) {
    return WithReason(absl::InternalError("the loss is not finite; the step was skipped"),
                      kSkipNonFiniteLoss);
  }
  out->loss.backward();
  return out->diagnostics;
}

namespace {

// The skip reasons a rank can hit before the exchange, in the order the
// summed failure counts are read.
constexpr const char* kLocalReasons[] = {kSkipNonFiniteLoss, kSkipInvalidBatch, kSkipOutOfMemory,
                                         kSkipTorchError, "error"};
constexpr size_t kNumLocalReasons = sizeof(kLocalReasons) / sizeof(kLocalReasons[0]);

}  // namespace

absl::StatusOr<StepResult> Trainer::StepShard(const std::vector<QueuedGroup>& shard,
                                              const StepTotals& totals, StepReducer* reducer) {
  ArmFaults();
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> sums;
  absl::StatusOr<StepResult> local = Guarded(
      "computing gradients", [&] { return ComputeGradientsUnguarded(shard, totals, &sums); });
  if (!local.ok()) local = ShardWithoutPoisonedGroups(shard, totals, &sums, local.status());
  std::vector<bool> stepped;
  ASYMPO_ASSIGN_OR_RETURN(StepResult result,
                          ReduceShard(std::move(local), sums, reducer, &stepped));
  absl::StatusOr<StepResult> step = Guarded("training step", [&] {
    return ApplyUnguarded(std::move(result), shard, sharded_ != nullptr ? &stepped : nullptr);
  });
  if (step.ok()) step->seconds = SecondsSince(start);  // the all-reduces included
  return step;
}

absl::StatusOr<StepResult> Trainer::ReduceShard(absl::StatusOr<StepResult> local,
                                                const std::vector<double>& sums,
                                                StepReducer* reducer, std::vector<bool>* stepped) {
  // [pool sums | tokens, micro-batches, gpg alpha, ranks with groups |
  //  failures per reason | ranks with a gradient, per parameter]
  const std::vector<at::Tensor> params = model_->parameters();
  std::vector<double> v = local.ok() ? sums : std::vector<double>(DiagnosticsPool::kSums, 0.0);
  const bool has_groups = local.ok() && local->diagnostics.groups > 0;
  v.push_back(local.ok() ? static_cast<double>(local->tokens) : 0.0);
  v.push_back(local.ok() ? static_cast<double>(local->micro_batches) : 0.0);
  v.push_back(has_groups ? local->diagnostics.gpg_alpha : 0.0);
  v.push_back(has_groups ? 1.0 : 0.0);
  const size_t failures = v.size();
  for (const char* reason : kLocalReasons) {
    v.push_back(!local.ok() && StepSkipReason(local.status()) == reason ? 1.0 : 0.0);
  }
  const size_t defined = v.size();
  for (const at::Tensor& p : params) v.push_back(p.grad().defined() ? 1.0 : 0.0);
  if (absl::Status s = reducer->SumValues(&v); !s.ok()) {
    optimizer_.ZeroGrad();
    return s;
  }
  for (size_t k = 0; k < kNumLocalReasons; ++k) {
    if (v[failures + k] == 0) continue;
    optimizer_.ZeroGrad();
    if (!local.ok()) return local.status();
    return WithReason(
        absl::InternalError(absl::StrCat(v[failures + k], " other rank(s) failed this step (",
                                         kLocalReasons[k], "); it was skipped on every rank")),
        kLocalReasons[k]);
  }
  if (v[DiagnosticsPool::kSums + 3] == 0) {  // every rank dropped all its groups as poisoned
    optimizer_.ZeroGrad();
    return WithStepSkipReason(
        absl::InternalError("every group of the step, on every rank, made the loss or the "
                            "gradient non-finite by its rewards; the step was skipped"),
        kSkipPoisonedGroups);
  }
  for (size_t i = 0; i < params.size(); ++i) stepped->push_back(v[defined + i] != 0);
  std::vector<at::Tensor> gradients;
  if (sharded_ == nullptr) {  // else ShardedAdamW reduce-scatters them
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!(*stepped)[i]) continue;  // no rank has a gradient for it: AdamW skips it
      at::Tensor p = params[i];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      gradients.push_back(p.grad());
    }
  }
  if (absl::Status s = gradients.empty() ? absl::OkStatus() : reducer->SumGradients(gradients);
      !s.ok()) {
    optimizer_.ZeroGrad();
    return s;
  }
  StepResult result = *std::move(local);
  DiagnosticsPool pool;
  const size_t extra = DiagnosticsPool::kSums;
  pool.SetSums(v.data(), v[extra + 3] > 0 ? v[extra + 2] / v[extra + 3] : 1.0);
  result.diagnostics = pool.Result();
  result.tokens = static_cast<int64_t>(v[extra]);
  result.micro_batches = static_cast<int64_t>(v[extra + 1]);
  return result;
}

}  // namespace asympo::learner
