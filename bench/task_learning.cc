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
//                 [--lora_rank 0] [--lora_alpha 0] [--lora_targets all]
// --lag k samples every step with the weights of k steps before (the newest
// while fewer steps exist): deterministic staleness, as a learner whose
// rollouts run k versions behind sees it. --csv writes one row per step
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
#include "bench/bench_flags.h"
#include "bench/task_sft.h"
#include "common/model/device.h"
#include "common/model/lora_flags.h"
#include "common/model/model_config.h"
#include "common/model/model_io.h"
#include "common/model/policy_model.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/trainer/trainer.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/evaluation.h"
#include "rollout_server/tasks/addition_task.h"
#include "rollout_server/tasks/tasks.h"

namespace {

using asympo::bench::Flag;
using asympo::bench::FlagD;
using asympo::bench::FlagS;

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

// The command line; defaults as in the usage at the top of this file.
struct Args {
  std::string task_name;
  int64_t steps;
  int64_t prompts;
  int64_t group;
  double lr;
  double temperature;
  std::string objective_name;
  int64_t max_new_tokens;  // 0: the task's own limit
  int64_t vocab;
  uint64_t seed;
  int64_t log_every;
  int threads;
  int32_t alphabet;
  int32_t min_length;
  int32_t max_length;
  double p_low, p_high, scale_floor;  // asympo_stable
  double clip_ratio_c = 0.0;          // grpo's dual clip (0: off)
  std::string advantage;              // mean or mean_std
  double weight_decay = 0.0;          // AdamW decoupled weight decay
  int64_t layers = 0;                 // 0: the tiny model's 2
  int64_t hidden = 0;                 // 0: the tiny model's 64 (4 heads of hidden / 4)
  int64_t lag;                        // sample with the weights of `lag` steps before
  std::string csv;                    // per-step rows; empty: none
  int64_t eval_every;                 // 0: only at the end
  int32_t eval_k;
  int64_t eval_prompts;    // held-out prompts evaluated; 0: the task's default set
  std::string eval_json;   // the last evaluation, per prompt; empty: none
  std::string init_model;  // a model directory to start from; empty: random
  int64_t lora_rank = 0;   // adapters (0: every weight trains)
  double lora_alpha = 0;
  std::string lora_targets;
  std::string save_model;  // where to write the model after --sft_steps
  asympo::bench::SftOptions sft;
  int64_t sft_steps = 0;
  int64_t base_stats = 64;
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  args.task_name = FlagS(argc, argv, "--task", "copy");
  args.steps = Flag(argc, argv, "--steps", 300);
  args.prompts = Flag(argc, argv, "--prompts", 8);
  args.group = Flag(argc, argv, "--group", 8);
  args.lr = FlagD(argc, argv, "--lr", 3e-3);
  args.temperature = FlagD(argc, argv, "--temperature", 1.0);
  args.objective_name = FlagS(argc, argv, "--objective", "asympo");
  args.max_new_tokens = Flag(argc, argv, "--max_new_tokens", 0);
  args.vocab = Flag(argc, argv, "--vocab", 64);
  args.seed = static_cast<uint64_t>(Flag(argc, argv, "--seed", 0));
  args.log_every = std::max<int64_t>(1, Flag(argc, argv, "--log_every", 10));
  args.threads = static_cast<int>(Flag(argc, argv, "--threads", 1));
  args.alphabet = static_cast<int32_t>(Flag(argc, argv, "--alphabet", 0));
  args.min_length = static_cast<int32_t>(Flag(argc, argv, "--min_length", 0));
  args.max_length = static_cast<int32_t>(Flag(argc, argv, "--max_length", 0));
  args.p_low = FlagD(argc, argv, "--p_low", learner::PolicyLossOptions().p_low);
  args.p_high = FlagD(argc, argv, "--p_high", learner::PolicyLossOptions().p_high);
  args.scale_floor = FlagD(argc, argv, "--scale_floor", learner::PolicyLossOptions().scale_floor);
  args.advantage = FlagS(argc, argv, "--advantage", "mean");
  args.clip_ratio_c = FlagD(argc, argv, "--clip_ratio_c", 0.0);
  args.weight_decay = FlagD(argc, argv, "--weight_decay", 0.0);
  args.layers = Flag(argc, argv, "--layers", 0);
  args.hidden = Flag(argc, argv, "--hidden", 0);
  args.lag = std::max<int64_t>(0, Flag(argc, argv, "--lag", 0));
  args.csv = FlagS(argc, argv, "--csv", "");
  args.eval_every = Flag(argc, argv, "--eval_every", 0);
  args.eval_k = static_cast<int32_t>(Flag(argc, argv, "--eval_k", 8));
  args.eval_prompts = std::max<int64_t>(0, Flag(argc, argv, "--eval_prompts", 0));
  args.eval_json = FlagS(argc, argv, "--eval_json", "");
  args.init_model = FlagS(argc, argv, "--init_model", "");
  args.save_model = FlagS(argc, argv, "--save_model", "");
  args.sft_steps = Flag(argc, argv, "--sft_steps", 0);
  args.sft.max_steps = std::max<int64_t>(1, args.sft_steps);
  args.sft.target_accuracy = FlagD(argc, argv, "--sft_target", 0.4);
  args.sft.lr = FlagD(argc, argv, "--sft_lr", 1e-3);
  args.sft.batch = Flag(argc, argv, "--sft_batch", 32);
  args.sft.eval_every = Flag(argc, argv, "--sft_eval_every", 50);
  args.base_stats = Flag(argc, argv, "--base_stats", 64);
  args.lora_rank = Flag(argc, argv, "--lora_rank", 0);
  args.lora_alpha = FlagD(argc, argv, "--lora_alpha", 0.0);
  args.lora_targets = FlagS(argc, argv, "--lora_targets", "all");
  asympo::bench::RejectUnknownFlags(argc, argv);
  return args;
}

// The task, the model and its trainer, and how to sample from the model.
// Members are destroyed in reverse order: the trainer before the model it
// holds.
struct Setup {
  std::unique_ptr<rollout::Task> task;
  std::unique_ptr<asympo::PolicyModel> model;
  // --lag > 0: the model the rollouts sample with, loaded every step from
  // `past` (the trained weights of the last lag + 1 steps, oldest first).
  std::unique_ptr<asympo::PolicyModel> behavior;
  std::deque<std::vector<std::pair<std::string, at::Tensor>>> past;
  std::unique_ptr<learner::Trainer> trainer;
  rollout::SamplingParams sampling;
};

// The tiny model, with --layers and --hidden when given (intermediate size
// 3 x hidden, 4 query heads and 2 key/value heads of hidden / 4).
asympo::ModelConfig ModelConfigFor(const Args& args) {
  asympo::ModelConfig config = asympo::ModelConfig::Tiny(args.vocab);
  if (args.layers > 0) config.num_hidden_layers = args.layers;
  if (args.hidden > 0) {
    config.hidden_size = args.hidden;
    config.intermediate_size = 3 * args.hidden;
    config.head_dim = args.hidden / config.num_attention_heads;
  }
  return config;
}

absl::StatusOr<Setup> CreateSetup(const Args& args) {
  Setup setup;
  rollout::TaskOptions task_options;
  task_options.name = args.task_name;
  task_options.vocab_size = args.vocab;
  task_options.synthetic_alphabet_size = args.alphabet;
  task_options.synthetic_min_length = args.min_length;
  task_options.synthetic_max_length = args.max_length;
  absl::StatusOr<std::unique_ptr<rollout::Task>> task = rollout::CreateTask(task_options);
  if (!task.ok()) return task.status();
  setup.task = *std::move(task);

  asympo::ModelOptions model_options;
  model_options.seed = args.seed;
  absl::StatusOr<asympo::LoraOptions> lora =
      asympo::LoraFromFlags(args.lora_rank, args.lora_alpha, args.lora_targets);
  if (!lora.ok()) return lora.status();
  model_options.lora = *lora;
  absl::StatusOr<std::unique_ptr<asympo::PolicyModel>> model =
      args.init_model.empty()
          ? asympo::PolicyModel::CreateRandom(ModelConfigFor(args), model_options)
          : asympo::LoadPolicyModel(args.init_model, model_options);
  if (!model.ok()) return model.status();
  setup.model = *std::move(model);
  if (setup.model->config().vocab_size < setup.task->min_vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--init_model ", args.init_model, ": its vocabulary (", setup.model->config().vocab_size,
        ") is smaller than the task needs (", setup.task->min_vocab_size(), ")"));
  }
  if (args.lag > 0) {
    absl::StatusOr<std::unique_ptr<asympo::PolicyModel>> behavior =
        asympo::PolicyModel::CreateRandom(setup.model->config(), model_options);
    if (!behavior.ok()) return behavior.status();
    setup.behavior = *std::move(behavior);
    // With adapters only they follow the trained model: the base is copied once.
    if (absl::Status s = setup.behavior->LoadWeights(setup.model->named_weights()); !s.ok()) {
      return s;
    }
  }

  learner::TrainerOptions trainer_options;
  absl::StatusOr<learner::Objective> objective = learner::ParseObjective(args.objective_name);
  if (!objective.ok()) return objective.status();
  trainer_options.loss.objective = *objective;
  trainer_options.loss.p_low = args.p_low;
  trainer_options.loss.p_high = args.p_high;
  trainer_options.loss.scale_floor = args.scale_floor;
  trainer_options.loss.clip_ratio_c = args.clip_ratio_c;
  absl::StatusOr<learner::AdvantageNormalization> advantage =
      learner::ParseAdvantageNormalization(args.advantage);
  if (!advantage.ok()) return advantage.status();
  trainer_options.loss.advantage.normalization = *advantage;
  trainer_options.lr.peak_lr = args.lr;
  trainer_options.adamw.weight_decay = args.weight_decay;
  absl::StatusOr<std::unique_ptr<learner::Trainer>> trainer =
      learner::Trainer::Create(trainer_options, setup.model.get(), /*publisher=*/nullptr);
  if (!trainer.ok()) return trainer.status();
  setup.trainer = *std::move(trainer);

  setup.sampling.temperature = args.temperature;
  setup.sampling.max_new_tokens = args.max_new_tokens > 0
                                      ? static_cast<int32_t>(args.max_new_tokens)
                                      : setup.task->max_new_tokens();
  setup.sampling.stop_token_ids = setup.task->stop_token_ids();
  // The grpo objective needs the sampling policy's token log-probs, and so
  // does the drift measured under --lag (behavior_kl).
  setup.sampling.return_logprobs = *objective == learner::Objective::kGrpo || args.lag > 0;
  return setup;
}

// The run's settings, then the progress table's header.
void PrintHeader(const Args& args, const rollout::SamplingParams& sampling) {
  std::printf(
      "task=%s objective=%s lr=%g prompts=%lld group=%lld temperature=%g max_new_tokens=%d "
      "vocab=%lld seed=%llu threads=%d\n",
      args.task_name.c_str(), args.objective_name.c_str(), args.lr,
      static_cast<long long>(args.prompts), static_cast<long long>(args.group), args.temperature,
      sampling.max_new_tokens, static_cast<long long>(args.vocab),
      static_cast<unsigned long long>(args.seed), at::get_num_threads());
  std::printf("%6s %8s %8s %8s %8s %8s\n", "step", "reward", "acc", "length", "nll", "seconds");
}

// One step's prompts and, for each, `group` sampling requests in a row.
struct PromptBatch {
  std::vector<rollout::TaskPrompt> prompts;
  std::vector<rollout::GenerationRequest> requests;
};

// Every request gets its own seed, so that a group's responses differ.
PromptBatch DrawPrompts(const Args& args, const rollout::SamplingParams& sampling,
                        rollout::Task* task, std::mt19937_64* rng) {
  PromptBatch batch;
  for (int64_t p = 0; p < args.prompts; ++p) {
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

// The trainer's input, and the step's reward and accuracy sums for the log.
struct ScoredGroups {
  std::vector<learner::QueuedGroup> groups;
  double reward_sum = 0;
  double correct = 0;
};

ScoredGroups ScoreGroups(const Args& args, const rollout::Task& task,
                         const std::vector<rollout::TaskPrompt>& prompts,
                         const std::vector<rollout::GenerationResult>& results,
                         uint64_t trainer_version) {
  ScoredGroups scored;
  scored.groups.resize(static_cast<size_t>(args.prompts));
  for (int64_t p = 0; p < args.prompts; ++p) {
    asympo::v1::PromptGroup& pg = scored.groups[p].group;
    pg.set_prompt_id(prompts[p].prompt_id);
    pg.mutable_prompt_tokens()->Add(prompts[p].prompt_tokens.begin(),
                                    prompts[p].prompt_tokens.end());
    int64_t tokens = 0;
    for (int64_t g = 0; g < args.group; ++g) {
      const rollout::GenerationResult& res = results[p * args.group + g];
      const rollout::TaskScore score = task.Score(prompts[p], res.tokens);
      asympo::v1::Response* r = pg.add_responses();
      r->mutable_tokens()->Add(res.tokens.begin(), res.tokens.end());
      r->mutable_behavior_logprobs()->Add(res.logprobs.begin(), res.logprobs.end());
      r->set_reward(static_cast<float>(score.reward));
      r->set_finish_reason(res.finish_reason);
      scored.reward_sum += score.reward;
      scored.correct += score.correct ? 1 : 0;
      tokens += static_cast<int64_t>(prompts[p].prompt_tokens.size() + res.tokens.size());
    }
    scored.groups[p].tokens = tokens;
    scored.groups[p].arrival_version = trainer_version;
  }
  return scored;
}

// Task add: the mean over the step's groups of the entropy of the operand
// orders their responses use.
double OrderEntropyOf(const Args& args, const std::vector<rollout::TaskPrompt>& prompts,
                      const std::vector<rollout::GenerationResult>& results) {
  double sum = 0;
  for (int64_t p = 0; p < args.prompts; ++p) {
    absl::StatusOr<std::vector<int32_t>> operands = rollout::AdditionOperands(prompts[p]);
    if (!operands.ok()) continue;
    std::vector<std::vector<int32_t>> responses;
    for (int64_t g = 0; g < args.group; ++g)
      responses.push_back(results[p * args.group + g].tokens);
    sum += rollout::AdditionOrderEntropy(*operands, responses).nats;
  }
  return args.prompts > 0 ? sum / static_cast<double>(args.prompts) : 0;
}

// --lag: the drift between the weights that sampled this step and the ones
// that train on it, as the mean token KL(behavior || current).
absl::StatusOr<double> BehaviorKl(const asympo::PolicyModel& model, const PromptBatch& batch,
                                  const std::vector<rollout::GenerationResult>& results) {
  std::vector<std::vector<int32_t>> prompts, responses;
  std::vector<std::vector<float>> logprobs;
  for (size_t i = 0; i < results.size(); ++i) {
    prompts.push_back(batch.requests[i].prompt);
    responses.push_back(results[i].tokens);
    logprobs.push_back(results[i].logprobs);
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
  // --lag: the mean token KL(behavior || current) of the step's samples.
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

// The model this step samples with: the trained one, or under --lag the
// behavior model holding the weights of `lag` steps before.
absl::StatusOr<const asympo::PolicyModel*> SamplingModel(const Args& args, Setup* setup) {
  if (args.lag == 0) return setup->model.get();
  std::vector<std::pair<std::string, at::Tensor>> now;
  for (const auto& [name, t] : setup->model->named_parameters()) {
    now.emplace_back(name, t.detach().clone());
  }
  setup->past.push_back(std::move(now));
  while (static_cast<int64_t>(setup->past.size()) > args.lag + 1) setup->past.pop_front();
  if (absl::Status s = setup->behavior->LoadParameters(setup->past.front()); !s.ok()) return s;
  return setup->behavior.get();
}

// Samples from the newest weights, scores the samples and trains one step
// on them. Returns the step's result and when training ended.
absl::StatusOr<learner::StepResult> RunStep(const Args& args,
                                            const rollout::GenerationEngine& engine, Setup* setup,
                                            std::mt19937_64* rng, History* history,
                                            Clock::time_point* train_end) {
  const auto gen_start = Clock::now();
  const PromptBatch batch = DrawPrompts(args, setup->sampling, setup->task.get(), rng);
  absl::StatusOr<const asympo::PolicyModel*> sampler = SamplingModel(args, setup);
  if (!sampler.ok()) return sampler.status();
  absl::StatusOr<std::vector<rollout::GenerationResult>> results =
      *sampler == setup->model.get() ? engine.Generate(batch.requests)
                                     : rollout::GenerationEngine(*sampler).Generate(batch.requests);
  if (!results.ok()) return results.status();
  if (setup->task->name() == "add") {
    history->order_entropy.push_back(OrderEntropyOf(args, batch.prompts, *results));
  }
  if (args.lag > 0) {
    absl::StatusOr<double> kl = BehaviorKl(*setup->model, batch, *results);
    if (!kl.ok()) return kl.status();
    history->behavior_kl.push_back(*kl);
  }
  ScoredGroups scored =
      ScoreGroups(args, *setup->task, batch.prompts, *results, setup->trainer->version());

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
  for (int64_t step = 0; step < args.steps; ++step) {
    Clock::time_point train_end;
    absl::StatusOr<learner::StepResult> result =
        RunStep(args, engine, setup, &rng, &history, &train_end);
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
