#include "learner_server/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
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

absl::StatusOr<StepResult> Trainer::Step(std::vector<QueuedGroup> groups) {
  const auto start = std::chrono::steady_clock::now();
  ASYMPO_ASSIGN_OR_RETURN(StepResult result, ComputeGradients(groups));
  // Global gradient norm, then clipping.
  double sq = 0;
  for (const at::Tensor& p : model_->parameters()) {
    if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) {
    optimizer_.ZeroGrad();
    return absl::InternalError("the gradient is not finite; the step was skipped");
  }
  if (options_.max_grad_norm > 0 && norm > options_.max_grad_norm) {
    at::NoGradGuard no_grad;
    const double scale = options_.max_grad_norm / (norm + 1e-6);
    for (const at::Tensor& p : model_->parameters()) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  result.learning_rate = LearningRate(options_.lr, static_cast<int64_t>(version_));
  optimizer_.Step(result.learning_rate);
  optimizer_.ZeroGrad();
  ++version_;
  for (const QueuedGroup& q : groups) result.staleness.push_back(version_ - 1 - q.arrival_version);
  if (publisher_ != nullptr) publisher_->Publish(version_, *model_);
  result.version = version_;
  result.grad_norm = norm;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

absl::StatusOr<StepResult> Trainer::ComputeGradients(const std::vector<QueuedGroup>& groups) {
  if (groups.empty()) return absl::InvalidArgumentError("a step needs at least one group");
  const bool grpo = loss_.needs_behavior_logprobs();
  const int64_t vocab = model_->config().vocab_size;
  StepTotals totals;
  int64_t all_tokens = 0;
  for (const QueuedGroup& q : groups) {
    const int64_t n = q.group.responses_size();
    totals.groups += 1;
    totals.responses += n;
    for (const v1::Response& r : q.group.responses()) totals.tokens += r.tokens_size();
    if (AllRewardsEqual(q.group)) totals.degenerate_responses += n;
    all_tokens += q.tokens;
  }

  StepResult result;
  DiagnosticsPool pool;
  optimizer_.ZeroGrad();
  for (const auto& micro : Pack(groups, options_.micro_batch_tokens)) {
    // Per response: prompt + response ids; the hidden state at position
    // P - 1 + j predicts response token j.
    int64_t n = 0, longest = 0, longest_response = 0;
    for (const QueuedGroup* q : micro) {
      n += q->group.responses_size();
      longest = std::max(longest, LongestSequence(q->group));
      for (const v1::Response& r : q->group.responses()) {
        longest_response = std::max<int64_t>(longest_response, r.tokens_size());
      }
    }
    at::Tensor ids = at::full({n, longest}, options_.pad_token_id, at::kLong);
    at::Tensor key_mask = at::zeros({n, longest}, at::kBool);
    at::Tensor resp_mask = at::zeros({n, longest_response}, at::kBool);
    at::Tensor rewards = at::empty({n}, at::kFloat);
    at::Tensor group_index = at::empty({n}, at::kLong);
    at::Tensor behavior = grpo ? at::zeros({n, longest_response}, at::kFloat) : at::Tensor();
    std::vector<int64_t> rows, targets;
    {
      auto ids_a = ids.accessor<int64_t, 2>();
      auto key_a = key_mask.accessor<bool, 2>();
      auto resp_a = resp_mask.accessor<bool, 2>();
      auto rew_a = rewards.accessor<float, 1>();
      auto grp_a = group_index.accessor<int64_t, 1>();
      float* beh = grpo ? behavior.data_ptr<float>() : nullptr;
      int64_t i = 0;
      for (size_t g = 0; g < micro.size(); ++g) {
        const v1::PromptGroup& pg = micro[g]->group;
        const int64_t p = pg.prompt_tokens_size();
        for (const v1::Response& r : pg.responses()) {
          for (int64_t t = 0; t < p; ++t) ids_a[i][t] = pg.prompt_tokens(static_cast<int>(t));
          for (int j = 0; j < r.tokens_size(); ++j) {
            const int32_t tok = r.tokens(j);
            if (tok < 0 || tok >= vocab) {
              return absl::InvalidArgumentError(
                  absl::StrCat("token ", tok, " is outside the model's vocabulary of ", vocab));
            }
            ids_a[i][p + j] = tok;
            resp_a[i][j] = true;
            rows.push_back(i * longest + p - 1 + j);
            targets.push_back(tok);
            if (grpo) beh[i * longest_response + j] = r.behavior_logprobs(j);
          }
          for (int64_t t = 0; t < p + r.tokens_size(); ++t) key_a[i][t] = true;
          rew_a[i] = r.reward();
          grp_a[i] = static_cast<int64_t>(g);
          ++i;
        }
      }
    }
    const at::Tensor positions =
        at::arange(longest, at::kLong).unsqueeze(0).expand({n, longest}).contiguous();
    const at::Tensor hidden = model_->Forward(ids, positions, key_mask);  // (N, T, H)
    const at::Tensor picked = hidden.reshape({-1, hidden.size(2)})
                                  .index_select(0, at::tensor(rows, at::kLong));  // (M, H)
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor logp, ChunkedTokenLogProbs(picked, model_->lm_head_weight(),
                                                                  at::tensor(targets, at::kLong),
                                                                  options_.logprob_chunk_rows));
    LossInputs in;
    in.token_logprobs =
        at::zeros({n, longest_response}, at::kFloat).masked_scatter(resp_mask, logp);
    in.mask = resp_mask;
    in.rewards = rewards;
    in.group_index = group_index;
    in.num_groups = static_cast<int64_t>(micro.size());
    if (grpo) in.behavior_logprobs = behavior;
    in.step_totals = totals;
    absl::StatusOr<LossOutput> out = loss_.Compute(in);
    if (!out.ok() || !std::isfinite(out->diagnostics.loss)) {
      optimizer_.ZeroGrad();
      return out.ok() ? absl::InternalError("the loss is not finite; the step was skipped")
                      : out.status();
    }
    out->loss.backward();
    pool.Add(out->diagnostics);
    ++result.micro_batches;
  }

  result.diagnostics = pool.Result();
  result.tokens = all_tokens;
  return result;
}

}  // namespace asympo::learner
