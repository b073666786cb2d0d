// Learnability of the built-in tasks: a synchronous, in-process RL loop on
// the tiny model from a random initialization. Each step draws P prompts
// from the task, samples G responses to each with the generation engine,
// scores them, and trains one optimizer step on the groups with the
// learner's Trainer. Generation uses the trained model object itself, so
// every step samples from the newest weights (no staleness) unless --lag.
//
//   task_learning --task copy [--steps 300] [--prompts 8] [--group 8]
//                 [--lr 3e-3] [--temperature 1] [--objective asympo]
//                 [--max_new_tokens 0] [--vocab 64] [--seed 0] [--threads 1]
//                 [--alphabet 0] [--min_length 0] [--max_length 0]
//                 [--log_every 10] [--lag 0] [--csv FILE] [--eval_every 0] [--eval_k 8]
//                 [--eval_prompts 0]
//                 [--p_low] [--p_high] [--scale_floor] [--advantage mean] [--eval_json FILE]
//                 [--clip_ratio_c 0] (grpo's dual clip: VeRL's grpo is --advantage mean_std
//                 --clip_ratio_c 3)
//                 [--weight_decay 0] [--layers 0] [--hidden 0]
//                 [--init_model DIR] [--sft_steps 0] [--sft_target 0.4] [--sft_lr 1e-3]
//                 [--sft_batch 32] [--sft_eval_every 50] [--save_model DIR] [--base_stats 64]
//                 [--lora_rank 0] [--lora_alpha 0] [--lora_targets all] [--minibatches 1]
// --lag k samples every step with the weights of k steps before (the newest
// while fewer steps exist): deterministic staleness, as a learner whose
// rollouts run k versions behind sees it. --minibatches k samples a batch of
// k x --prompts prompts at every k-th step and trains it as k steps of
// --prompts groups each, in turn (VeRL's batch trained as mini-batches: the
// j-th step of a batch trains on samples j steps old, lag + j under --lag;
// --steps must be a multiple of k). --csv writes one row per step
// (reward, accuracy, the loss diagnostics, the learner's collapse gauge and,
// for task add, the entropy of the operand orders within a group).
// --eval_json writes the latest held-out evaluation with its per-prompt rows
// (asympo-eval's JSON).
// --lora_rank R trains rank-R adapters (alpha --lora_alpha, 0: 2R) on the
// --lora_targets projections instead of every weight (common/model/lora.h).
// --init_model starts from a model directory (an --export_dir, or one
// --save_model wrote) instead of random weights. --sft_steps N first trains
// the model on the task's reference solutions (bench/task_sft.h) for at
// most N steps, stopping once the held-out greedy accuracy reaches
// --sft_target; --save_model writes the model directory after it (before
// RL), which --init_model, asympo-eval --model and both daemons' --model
// read. With either, --base_stats P samples P groups before RL and prints
// the base's S_g range and within-group 1/S_g ratios. --steps 0 stops there.
// Prints one line per --log_every steps (reward and accuracy of that step's
// samples, averaged over the last --log_every steps), then a summary: mean
// reward and accuracy over the first and last 20 steps, and wall time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "bench/task_learning_setup.h"
#include "bench/task_sft.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/model/policy_model.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/trainer/trainer.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/evaluation.h"
#include "rollout_server/tasks/addition_task.h"
#include "rollout_server/tasks/tasks.h"

namespace {

using asympo::bench::task_learning::Args;
using asympo::bench::task_learning::CreateSetup;
using asympo::bench::task_learning::ParseArgs;
using asympo::bench::task_learning::Setup;

namespace rollout = asympo::rollout;
namespace learner = asympo::learner;
using Clock = std::chrono::steady_clock;

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  end = std::min(end, v.size());
  if (begin >= end) return 0;
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "task_learning: %s\n", s.ToString().c_str());
  return 1;
}

// The run's settings, then the progress table's header.
void PrintHeader(const Args& args, const rollout::SamplingParams& sampling) {
  std::printf(
      "task=%s objective=%s lr=%g prompts=%lld group=%lld lag=%lld minibatches=%lld "
      "temperature=%g max_new_tokens=%d vocab=%lld seed=%llu threads=%d\n",
      args.task_name.c_str(), args.objective_name.c_str(), args.lr,
      static_cast<long long>(args.prompts), static_cast<long long>(args.group),
      static_cast<long long>(args.lag), static_cast<long long>(args.minibatches), args.temperature,
      sampling.max_new_tokens, static_cast<long long>(args.vocab),
      static_cast<unsigned long long>(args.seed), at::get_num_threads());
  std::printf("%6s %8s %8s %8s %8s %8s\n", "step", "reward", "acc", "length", "nll", "seconds");
}

// A batch's prompts and, for each, `group` sampling requests in a row.
struct PromptBatch {
  std::vector<rollout::TaskPrompt> prompts;
  std::vector<rollout::GenerationRequest> requests;
};

// `count` prompts; every request gets its own seed, so that a group's
// responses differ.
PromptBatch DrawPrompts(const Args& args, int64_t count, const rollout::SamplingParams& sampling,
                        rollout::Task* task, std::mt19937_64* rng) {
  PromptBatch batch;
  for (int64_t p = 0; p < count; ++p) {
    batch.prompts.push_back(task->NextPrompt(*rng));
    for (int64_t g = 0; g < args.group; ++g) {
      rollout::GenerationRequest r;
      r.prompt = batch.prompts.back().prompt_tokens;
      r.params = sampling;
      r.params.seed = (*rng)();
      batch.requests.push_back(std::move(r));
    }
  }
  return batch;
}

// One step's groups: the prompts [first, first + args.prompts) of the batch
// sampled for it, with their responses (`group` per prompt, in a row).
struct MiniBatch {
  const PromptBatch* batch;
  const std::vector<rollout::GenerationResult>* results;
  int64_t first;
  int64_t group;
  const rollout::TaskPrompt& prompt(int64_t p) const { return batch->prompts[first + p]; }
  const rollout::GenerationResult& result(int64_t p, int64_t g) const {
    return (*results)[(first + p) * group + g];
  }
};

// The trainer's input, and the step's reward and accuracy sums for the log.
struct ScoredGroups {
  std::vector<learner::QueuedGroup> groups;
  double reward_sum = 0;
  double correct = 0;
};

ScoredGroups ScoreGroups(const Args& args, const rollout::Task& task, const MiniBatch& mb,
                         uint64_t sampled_version) {
  ScoredGroups scored;
  scored.groups.resize(static_cast<size_t>(args.prompts));
  for (int64_t p = 0; p < args.prompts; ++p) {
    asympo::v1::PromptGroup& pg = scored.groups[p].group;
    const rollout::TaskPrompt& prompt = mb.prompt(p);
    pg.set_prompt_id(prompt.prompt_id);
    pg.mutable_prompt_tokens()->Add(prompt.prompt_tokens.begin(), prompt.prompt_tokens.end());
    int64_t tokens = 0;
    for (int64_t g = 0; g < args.group; ++g) {
      const rollout::GenerationResult& res = mb.result(p, g);
      const rollout::TaskScore score = task.Score(prompt, res.tokens);
      asympo::v1::Response* r = pg.add_responses();
      r->mutable_tokens()->Add(res.tokens.begin(), res.tokens.end());
      r->mutable_behavior_logprobs()->Add(res.logprobs.begin(), res.logprobs.end());
      r->set_reward(static_cast<float>(score.reward));
      r->set_finish_reason(res.finish_reason);
      scored.reward_sum += score.reward;
      scored.correct += score.correct ? 1 : 0;
      tokens += static_cast<int64_t>(prompt.prompt_tokens.size() + res.tokens.size());
    }
    scored.groups[p].tokens = tokens;
    scored.groups[p].arrival_version = sampled_version;
  }
  return scored;
}

// Task add: the mean over the step's groups of the entropy of the operand
// orders their responses use.
double OrderEntropyOf(const Args& args, const MiniBatch& mb) {
  double sum = 0;
  for (int64_t p = 0; p < args.prompts; ++p) {
    absl::StatusOr<std::vector<int32_t>> operands = rollout::AdditionOperands(mb.prompt(p));
    if (!operands.ok()) continue;
    std::vector<std::vector<int32_t>> responses;
    for (int64_t g = 0; g < args.group; ++g) responses.push_back(mb.result(p, g).tokens);
    sum += rollout::AdditionOrderEntropy(*operands, responses).nats;
  }
  return sum / static_cast<double>(args.prompts);
}

// --lag or --minibatches: the drift between the weights that sampled this
// step's groups and the ones that train on them, as the mean token
// KL(behavior || current).
absl::StatusOr<double> BehaviorKl(const Args& args, const asympo::PolicyModel& model,
                                  const MiniBatch& mb) {
  std::vector<std::vector<int32_t>> prompts, responses;
  std::vector<std::vector<float>> logprobs;
  for (int64_t p = 0; p < args.prompts; ++p) {
    for (int64_t g = 0; g < args.group; ++g) {
      const rollout::GenerationResult& res = mb.result(p, g);
      prompts.push_back(mb.prompt(p).prompt_tokens);
      responses.push_back(res.tokens);
      logprobs.push_back(res.logprobs);
    }
  }
  return asympo::bench::MeanTokenKl(model, prompts, responses, logprobs);
}

// Per-step means of the samples' reward and accuracy, and where the time went.
struct History {
  std::vector<double> rewards;
  std::vector<double> accuracies;
  // Task add: the mean over the step's groups of the entropy of the operand
  // orders their responses use (nats); empty for the other tasks.
  std::vector<double> order_entropy;
  // --lag or --minibatches: the mean token KL(behavior || current) of the
  // step's samples.
  std::vector<double> behavior_kl;
  double gen_seconds = 0;
  double train_seconds = 0;
  // The learner's collapse gauge (asympo_learner_collapse_suspected) with
  // its default options, fed the same per-step reward means.
  learner::CollapseDetector collapse{learner::CollapseOptions{}};
  std::unique_ptr<std::ofstream> csv;  // --csv
};

// --csv: the header, then one row per step.
constexpr char kCsvHeader[] =
    "step,reward,accuracy,mean_nll,s_pos,s_neg,naive_ratio,clip_low,clip_high,"
    "degenerate_fraction,response_length,grad_norm,collapse_ema,collapse_suspected,order_entropy,"
    "behavior_kl\n";

void RecordStep(int64_t step, const learner::StepResult& result, History* history) {
  const bool suspected = history->collapse.Observe(result.diagnostics.reward_mean);
  if (history->csv == nullptr) return;
  const learner::LossDiagnostics& d = result.diagnostics;
  *history->csv << (step + 1) << ',' << history->rewards.back() << ',' << history->accuracies.back()
                << ',' << d.mean_nll << ',' << d.s_pos << ',' << d.s_neg << ',' << d.naive_ratio
                << ',' << d.clip_low_fraction << ',' << d.clip_high_fraction << ','
                << d.degenerate_group_fraction << ',' << d.mean_response_length << ','
                << result.grad_norm << ',' << history->collapse.ema() << ',' << (suspected ? 1 : 0)
                << ',';
  if (!history->order_entropy.empty()) *history->csv << history->order_entropy.back();
  *history->csv << ',';
  if (!history->behavior_kl.empty()) *history->csv << history->behavior_kl.back();
  *history->csv << '\n';
}

// --lag: keeps the weights that train this step (the last lag + 1 steps').
void RememberWeights(const Args& args, Setup* setup) {
  if (args.lag == 0) return;
  std::vector<std::pair<std::string, at::Tensor>> now;
  for (const auto& [name, t] : setup->model->named_parameters()) {
    now.emplace_back(name, t.detach().clone());
  }
  setup->past.push_back(std::move(now));
  while (static_cast<int64_t>(setup->past.size()) > args.lag + 1) setup->past.pop_front();
}

// A batch of --minibatches steps' prompts, sampled at its first step, with
// the trainer's version then.
struct SampledBatch {
  PromptBatch batch;
  std::vector<rollout::GenerationResult> results;
  uint64_t version = 0;
};

// Samples a batch with the trained model, or under --lag with the behavior
// model holding the weights of `lag` steps before.
absl::Status SampleBatch(const Args& args, const rollout::GenerationEngine& engine, Setup* setup,
                         std::mt19937_64* rng, SampledBatch* out) {
  out->batch =
      DrawPrompts(args, args.prompts * args.minibatches, setup->sampling, setup->task.get(), rng);
  out->version = setup->trainer->version();
  absl::StatusOr<std::vector<rollout::GenerationResult>> results;
  if (args.lag == 0) {
    results = engine.Generate(out->batch.requests);
  } else {
    if (absl::Status s = setup->behavior->LoadParameters(setup->past.front()); !s.ok()) return s;
    results = rollout::GenerationEngine(setup->behavior.get()).Generate(out->batch.requests);
  }
  if (!results.ok()) return results.status();
  out->results = *std::move(results);
  return absl::OkStatus();
}

// One step: every --minibatches-th samples a batch; each trains on its own
// --prompts groups of it. Returns the step's result and when training ended.
absl::StatusOr<learner::StepResult> RunStep(const Args& args, int64_t step,
                                            const rollout::GenerationEngine& engine, Setup* setup,
                                            std::mt19937_64* rng, SampledBatch* sampled,
                                            History* history, Clock::time_point* train_end) {
  const auto gen_start = Clock::now();
  RememberWeights(args, setup);
  const int64_t j = step % args.minibatches;
  if (j == 0) {
    if (absl::Status s = SampleBatch(args, engine, setup, rng, sampled); !s.ok()) return s;
  }
  const MiniBatch mb{&sampled->batch, &sampled->results, j * args.prompts, args.group};
  if (setup->task->name() == "add") history->order_entropy.push_back(OrderEntropyOf(args, mb));
  if (args.lag > 0 || args.minibatches > 1) {
    absl::StatusOr<double> kl = BehaviorKl(args, *setup->model, mb);
    if (!kl.ok()) return kl.status();
    history->behavior_kl.push_back(*kl);
  }
  ScoredGroups scored = ScoreGroups(args, *setup->task, mb, sampled->version);

  const auto train_start = Clock::now();
  absl::StatusOr<learner::StepResult> result = setup->trainer->Step(std::move(scored.groups));
  if (!result.ok()) return result.status();
  *train_end = Clock::now();
  history->gen_seconds += Seconds(gen_start, train_start);
  history->train_seconds += Seconds(train_start, *train_end);

  const double n = static_cast<double>(args.prompts * args.group);
  history->rewards.push_back(scored.reward_sum / n);
  history->accuracies.push_back(scored.correct / n);
  return result;
}

// One line per --log_every steps: the means over those steps, and the
// run's seconds so far.
void PrintProgress(int64_t step, int64_t log_every, const History& history,
                   const learner::StepResult& result, double seconds) {
  const size_t end = history.rewards.size();
  const size_t begin = end - std::min<size_t>(end, log_every);
  std::printf("%6lld %8.3f %8.3f %8.2f %8.3f %8.1f\n", static_cast<long long>(step + 1),
              Mean(history.rewards, begin, end), Mean(history.accuracies, begin, end),
              result.diagnostics.mean_response_length, result.diagnostics.mean_nll, seconds);
  std::fflush(stdout);
}

// Whether the task was learnt: the first 20 steps against the last 20.
void PrintSummary(const Args& args, const History& history, double seconds) {
  const std::vector<double>& rewards = history.rewards;
  const std::vector<double>& accuracies = history.accuracies;
  const size_t k = std::min<size_t>(20, rewards.size());
  std::printf(
      "summary task=%s steps=%lld first20_reward=%.3f last20_reward=%.3f first20_acc=%.3f "
      "last20_acc=%.3f seconds=%.1f generate_s=%.1f train_s=%.1f\n",
      args.task_name.c_str(), static_cast<long long>(args.steps), Mean(rewards, 0, k),
      Mean(rewards, rewards.size() - k, rewards.size()), Mean(accuracies, 0, k),
      Mean(accuracies, accuracies.size() - k, accuracies.size()), seconds, history.gen_seconds,
      history.train_seconds);
}

// Greedy accuracy, mean@k and pass@k on the task's held-out prompts.
absl::Status PrintEvaluation(const Args& args, const rollout::GenerationEngine& engine,
                             const rollout::Task& task, int64_t step) {
  rollout::EvaluationOptions options;
  options.k = args.eval_k;
  options.temperature = args.temperature;
  options.seed = args.seed + 1000003 * static_cast<uint64_t>(step);
  absl::StatusOr<rollout::EvaluationReport> report =
      rollout::Evaluate(engine, task, task.EvaluationPrompts(args.eval_prompts), options);
  if (!report.ok()) return report.status();
  std::printf("eval step=%lld %s\n", static_cast<long long>(step),
              rollout::EvaluationSummary(*report).c_str());
  std::fflush(stdout);
  if (args.eval_json.empty()) return absl::OkStatus();
  std::ofstream out(args.eval_json);
  out << rollout::EvaluationJson(*report, /*per_prompt=*/true);
  if (!out) return absl::InvalidArgumentError("--eval_json " + args.eval_json + ": cannot write");
  return absl::OkStatus();
}

// The whole run: --steps steps, logged as they go, then the summary.
absl::Status Train(const Args& args, Setup* setup) {
  // Generation runs on the trained model itself: no stale weights.
  const rollout::GenerationEngine engine(setup->model.get());
  std::mt19937_64 rng(args.seed);
  History history;
  if (!args.csv.empty()) {
    history.csv = std::make_unique<std::ofstream>(args.csv);
    *history.csv << kCsvHeader;
    if (!*history.csv) return absl::InvalidArgumentError("--csv " + args.csv + ": cannot write");
  }
  const auto start = Clock::now();
  SampledBatch sampled;
  for (int64_t step = 0; step < args.steps; ++step) {
    Clock::time_point train_end;
    absl::StatusOr<learner::StepResult> result =
        RunStep(args, step, engine, setup, &rng, &sampled, &history, &train_end);
    if (!result.ok()) return result.status();
    RecordStep(step, *result, &history);
    if ((step + 1) % args.log_every == 0 || step + 1 == args.steps) {
      PrintProgress(step, args.log_every, history, *result, Seconds(start, train_end));
    }
    if (args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 != args.steps) {
      if (absl::Status s = PrintEvaluation(args, engine, *setup->task, step + 1); !s.ok()) return s;
    }
  }
  PrintSummary(args, history, Seconds(start, Clock::now()));
  return PrintEvaluation(args, engine, *setup->task, args.steps);
}

}  // namespace

// --sft_steps, --save_model and --base_stats: the base model before RL.
absl::Status PrepareBase(const Args& args, Setup* setup) {
  if (args.sft_steps > 0) {
    asympo::bench::SftOptions o = args.sft;
    o.seed = args.seed;
    absl::StatusOr<asympo::bench::SftResult> r =
        asympo::bench::RunSft(setup->model.get(), setup->task.get(), o);
    if (!r.ok()) return r.status();
    std::printf(
        "sft done steps=%lld greedy_acc=%.3f target=%.2f reached=%d loss=%.4f seconds=%.1f\n",
        static_cast<long long>(r->steps), r->accuracy, o.target_accuracy, r->reached ? 1 : 0,
        r->last_loss, r->seconds);
  }
  if (!args.save_model.empty()) {
    if (absl::Status s = asympo::ExportPolicyModel(*setup->model, args.save_model); !s.ok()) {
      return s;
    }
    std::printf("model written to %s\n", args.save_model.c_str());
  }
  if ((args.sft_steps > 0 || !args.init_model.empty()) && args.base_stats > 0) {
    absl::StatusOr<asympo::bench::BaseStatistics> stats = asympo::bench::MeasureBase(
        *setup->model, setup->task.get(), args.base_stats, args.group, args.seed + 17);
    if (!stats.ok()) return stats.status();
    std::printf("%s\n", asympo::bench::BaseStatisticsLine(*stats).c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  asympo::SetCpuThreads(args.threads);
  torch::manual_seed(args.seed);
  absl::StatusOr<Setup> setup = CreateSetup(args);
  if (!setup.ok()) return Fail(setup.status());
  if (absl::Status s = PrepareBase(args, &*setup); !s.ok()) return Fail(s);
  if (args.steps == 0) return 0;
  PrintHeader(args, setup->sampling);
  const absl::Status status = Train(args, &*setup);
  if (!status.ok()) return Fail(status);
  return 0;
}
