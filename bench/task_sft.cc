#include "bench/task_sft.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <ATen/ATen.h>
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "learner_server/loss/token_logprobs.h"
#include "learner_server/optim/adamw.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/evaluation.h"
#include "rollout_server/tasks/addition_task.h"

namespace asympo::bench {
namespace {

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

// Each sequence (prompt + response) padded into a batch, and (B, T - 1)
// log-probs under `model` of every next token (TokenLogProbs: 0 past a
// sequence's end), with the 0/1 mask of those that are response tokens:
// position j predicts token j + 1.
struct ResponseLogProbs {
  at::Tensor logp, response_mask;
};

absl::StatusOr<ResponseLogProbs> LogProbsOf(const PolicyModel& model,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::vector<int32_t>>& responses) {
  std::vector<std::vector<int32_t>> sequences;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sequences.push_back(prompts[i]);
    sequences.back().insert(sequences.back().end(), responses[i].begin(), responses[i].end());
  }
  const learner::PaddedSequences padded = learner::PadSequences(sequences);
  const int64_t b = padded.ids.size(0), t = padded.ids.size(1);
  at::Tensor response_mask = at::zeros({b, t - 1}, at::kFloat);
  auto mask = response_mask.accessor<float, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t p = static_cast<int64_t>(prompts[static_cast<size_t>(i)].size());
    const int64_t n = static_cast<int64_t>(sequences[static_cast<size_t>(i)].size());
    for (int64_t j = p - 1; j < n - 1; ++j) mask[i][j] = 1;
  }
  const at::Device device = model.options().device;
  const at::Tensor ids = padded.ids.to(device), key_mask = padded.mask.to(device);
  const at::Tensor positions = at::arange(t, at::kLong).unsqueeze(0).expand({b, t}).to(device);
  const at::Tensor hidden = model.Forward(ids, positions.contiguous(), key_mask);
  const at::Tensor logits = model.Logits(hidden.narrow(1, 0, t - 1)).to(at::kFloat);
  absl::StatusOr<at::Tensor> logp =
      learner::TokenLogProbs(logits, ids.narrow(1, 1, t - 1), key_mask.narrow(1, 1, t - 1));
  if (!logp.ok()) return logp.status();
  return ResponseLogProbs{*std::move(logp), response_mask.to(device)};
}

absl::StatusOr<double> GreedyAccuracy(const PolicyModel& model, const rollout::Task& task,
                                      int64_t prompts) {
  const rollout::GenerationEngine engine(&model);
  rollout::EvaluationOptions o;
  o.k = 0;  // greedy only
  absl::StatusOr<rollout::EvaluationReport> report =
      rollout::Evaluate(engine, task, task.EvaluationPrompts(prompts), o);
  if (!report.ok()) return report.status();
  return report->greedy_accuracy;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ReferenceResponse(const rollout::Task& task,
                                                       const rollout::TaskPrompt& prompt,
                                                       std::mt19937_64& rng) {
  if (task.name() == "add") {
    absl::StatusOr<std::vector<int32_t>> operands = rollout::AdditionOperands(prompt);
    if (!operands.ok()) return operands.status();
    return rollout::RandomAdditionSolution(*operands, rng);
  }
  if (task.name() == "math") {
    return absl::UnimplementedError(
        "supervised training needs reference responses; task math "
        "has only final answers");
  }
  std::vector<int32_t> out;
  for (absl::string_view piece : absl::StrSplit(prompt.reference, ' ', absl::SkipEmpty())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("reference \"", prompt.reference, "\" is not a list of token ids"));
    }
    out.push_back(id);
  }
  out.push_back(rollout::synthetic::kEosId);
  return out;
}

absl::StatusOr<SftResult> RunSft(PolicyModel* model, rollout::Task* task, const SftOptions& o) {
  if (o.max_steps < 1 || o.batch < 1 || o.eval_every < 1 || o.eval_prompts < 1 || o.lr <= 0) {
    return absl::InvalidArgumentError(
        "supervised training: max_steps, batch, eval_every, eval_prompts and lr must be positive");
  }
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 rng(o.seed);
  learner::AdamW optimizer(model->parameters(), learner::AdamWOptions{});
  SftResult result;
  for (int64_t step = 1; step <= o.max_steps; ++step) {
    std::vector<std::vector<int32_t>> prompts, responses;
    for (int64_t i = 0; i < o.batch; ++i) {
      rollout::TaskPrompt p = task->NextPrompt(rng);
      absl::StatusOr<std::vector<int32_t>> r = ReferenceResponse(*task, p, rng);
      if (!r.ok()) return r.status();
      prompts.push_back(std::move(p.prompt_tokens));
      responses.push_back(*std::move(r));
    }
    absl::StatusOr<ResponseLogProbs> lp = LogProbsOf(*model, prompts, responses);
    if (!lp.ok()) return lp.status();
    const at::Tensor loss = -(lp->logp * lp->response_mask).sum() / lp->response_mask.sum();
    optimizer.ZeroGrad();
    loss.backward();
    const double norm = learner::GradientNorm(model->parameters());
    if (norm > o.max_grad_norm && std::isfinite(norm)) {
      for (at::Tensor& p : model->parameters()) {
        if (p.grad().defined()) p.grad().mul_(o.max_grad_norm / norm);
      }
    }
    optimizer.Step(o.lr);
    result.steps = step;
    result.last_loss = loss.item<double>();
    if (step % o.eval_every == 0 || step == o.max_steps) {
      absl::StatusOr<double> accuracy = GreedyAccuracy(*model, *task, o.eval_prompts);
      if (!accuracy.ok()) return accuracy.status();
      result.accuracy = *accuracy;
      std::printf("sft step=%lld loss=%.4f greedy_acc=%.3f (%lld held-out prompts)\n",
                  static_cast<long long>(step), result.last_loss, result.accuracy,
                  static_cast<long long>(o.eval_prompts));
      std::fflush(stdout);
      if (result.accuracy >= o.target_accuracy) {
        result.reached = true;
        break;
      }
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

absl::StatusOr<double> MeanTokenKl(const PolicyModel& model,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   const std::vector<std::vector<int32_t>>& responses,
                                   const std::vector<std::vector<float>>& behavior_logprobs) {
  if (prompts.empty() || prompts.size() != responses.size() ||
      responses.size() != behavior_logprobs.size()) {
    return absl::InvalidArgumentError(
        "MeanTokenKl: prompts, responses and log-probs differ in count");
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    if (responses[i].size() != behavior_logprobs[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat("MeanTokenKl: response ", i, " has ",
                                                     responses[i].size(), " tokens and ",
                                                     behavior_logprobs[i].size(), " log-probs"));
    }
  }
  at::NoGradGuard no_grad;
  absl::StatusOr<ResponseLogProbs> lp = LogProbsOf(model, prompts, responses);
  if (!lp.ok()) return lp.status();
  const at::Tensor logp = lp->logp.cpu();
  auto current = logp.accessor<float, 2>();
  double sum = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < responses.size(); ++i) {
    const size_t p = prompts[i].size();
    for (size_t j = 0; j < responses[i].size(); ++j) {
      // Response token j is predicted at position p + j - 1.
      sum += behavior_logprobs[i][j] -
             current[static_cast<int64_t>(i)][static_cast<int64_t>(p + j - 1)];
      ++tokens;
    }
  }
  return tokens > 0 ? sum / static_cast<double>(tokens) : 0.0;
}

absl::StatusOr<BaseStatistics> MeasureBase(const PolicyModel& model, rollout::Task* task,
                                           int64_t prompts, int64_t group, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<rollout::TaskPrompt> drawn;
  std::vector<rollout::GenerationRequest> requests;
  for (int64_t p = 0; p < prompts; ++p) {
    drawn.push_back(task->NextPrompt(rng));
    for (int64_t g = 0; g < group; ++g) {
      rollout::GenerationRequest r;
      r.prompt = drawn.back().prompt_tokens;
      r.params.temperature = 1.0;
      r.params.max_new_tokens = task->max_new_tokens();
      r.params.stop_token_ids = task->stop_token_ids();
      r.params.return_logprobs = true;
      r.params.seed = rng();
      requests.push_back(std::move(r));
    }
  }
  const rollout::GenerationEngine engine(&model);
  absl::StatusOr<std::vector<rollout::GenerationResult>> results = engine.Generate(requests);
  if (!results.ok()) return results.status();
  BaseStatistics out;
  std::vector<double> s_all, ratios;
  double correct = 0;
  for (int64_t p = 0; p < prompts; ++p) {
    double lo = 0, hi = 0;
    for (int64_t g = 0; g < group; ++g) {
      const rollout::GenerationResult& r = (*results)[static_cast<size_t>(p * group + g)];
      if (r.logprobs.empty()) continue;
      double nll = 0;
      for (float lp : r.logprobs) nll -= lp;
      const double s = nll / static_cast<double>(r.logprobs.size());
      s_all.push_back(s);
      const double inv = 1.0 / std::max(s, 1e-6);
      lo = g == 0 ? inv : std::min(lo, inv);
      hi = g == 0 ? inv : std::max(hi, inv);
      correct += task->Score(drawn[static_cast<size_t>(p)], r.tokens).correct ? 1 : 0;
    }
    if (lo > 0) ratios.push_back(hi / lo);
  }
  out.responses = static_cast<int64_t>(s_all.size());
  out.s_median = Quantile(s_all, 0.5);
  out.s_p10 = Quantile(s_all, 0.1);
  out.s_p90 = Quantile(s_all, 0.9);
  out.ratio_median = Quantile(ratios, 0.5);
  out.ratio_p90 = Quantile(ratios, 0.9);
  out.accuracy = s_all.empty() ? 0 : correct / static_cast<double>(s_all.size());
  return out;
}

std::string BaseStatisticsLine(const BaseStatistics& s) {
  return absl::StrFormat(
      "base responses=%lld S_g median=%.3f p10=%.3f p90=%.3f nats; within-group max/min of 1/S_g "
      "median=%.2f p90=%.2f; sample accuracy=%.3f",
      static_cast<long long>(s.responses), s.s_median, s.s_p10, s.s_p90, s.ratio_median,
      s.ratio_p90, s.accuracy);
}

}  // namespace asympo::bench
