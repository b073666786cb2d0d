// Learnability of the built-in tasks: a synchronous, in-process RL loop on
// the tiny model from a random initialization. Each step draws P prompts
// from the task, samples G responses to each with the generation engine,
// scores them, and trains one optimizer step on the groups with the
// learner's Trainer. Generation uses the trained model object itself, so
// every step samples from the newest weights (no staleness).
//
//   task_learning --task copy [--steps 300] [--prompts 8] [--group 8]
//                 [--lr 3e-3] [--temperature 1] [--objective asympo]
//                 [--max_new_tokens 0] [--vocab 64] [--seed 0] [--threads 1]
//                 [--alphabet 0] [--min_length 0] [--max_length 0]
//                 [--log_every 10]
// Prints one line per --log_every steps (reward and accuracy of that step's
// samples, averaged over the last --log_every steps), then a summary: mean
// reward and accuracy over the first and last 20 steps, and wall time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include "bench/bench_flags.h"
#include "common/model/model_config.h"
#include "common/model/policy_model.h"
#include "learner_server/trainer.h"
#include "rollout_server/generation.h"
#include "rollout_server/tasks.h"

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
  return args;
}

// The task, the model and its trainer, and how to sample from the model.
// Members are destroyed in reverse order: the trainer before the model it
// holds.
struct Setup {
  std::unique_ptr<rollout::Task> task;
  std::unique_ptr<asympo::PolicyModel> model;
  std::unique_ptr<learner::Trainer> trainer;
  rollout::SamplingParams sampling;
};

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
  absl::StatusOr<std::unique_ptr<asympo::PolicyModel>> model =
      asympo::PolicyModel::CreateRandom(asympo::ModelConfig::Tiny(args.vocab), model_options);
  if (!model.ok()) return model.status();
  setup.model = *std::move(model);

  learner::TrainerOptions trainer_options;
  absl::StatusOr<learner::Objective> objective = learner::ParseObjective(args.objective_name);
  if (!objective.ok()) return objective.status();
  trainer_options.loss.objective = *objective;
  trainer_options.lr.peak_lr = args.lr;
  absl::StatusOr<std::unique_ptr<learner::Trainer>> trainer =
      learner::Trainer::Create(trainer_options, setup.model.get(), /*publisher=*/nullptr);
  if (!trainer.ok()) return trainer.status();
  setup.trainer = *std::move(trainer);

  setup.sampling.temperature = args.temperature;
  setup.sampling.max_new_tokens = args.max_new_tokens > 0
                                      ? static_cast<int32_t>(args.max_new_tokens)
                                      : setup.task->max_new_tokens();
  setup.sampling.stop_token_ids = setup.task->stop_token_ids();
  // Only the grpo objective needs the sampling policy's token log-probs.
  setup.sampling.return_logprobs = *objective == learner::Objective::kGrpo;
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

// Per-step means of the samples' reward and accuracy, and where the time went.
struct History {
  std::vector<double> rewards;
  std::vector<double> accuracies;
  double gen_seconds = 0;
  double train_seconds = 0;
};

// Samples from the newest weights, scores the samples and trains one step
// on them. Returns the step's result and when training ended.
absl::StatusOr<learner::StepResult> RunStep(const Args& args,
                                            const rollout::GenerationEngine& engine, Setup* setup,
                                            std::mt19937_64* rng, History* history,
                                            Clock::time_point* train_end) {
  const auto gen_start = Clock::now();
  const PromptBatch batch = DrawPrompts(args, setup->sampling, setup->task.get(), rng);
  absl::StatusOr<std::vector<rollout::GenerationResult>> results = engine.Generate(batch.requests);
  if (!results.ok()) return results.status();
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

// The whole run: --steps steps, logged as they go, then the summary.
absl::Status Train(const Args& args, Setup* setup) {
  // Generation runs on the trained model itself: no stale weights.
  const rollout::GenerationEngine engine(setup->model.get());
  std::mt19937_64 rng(args.seed);
  History history;
  const auto start = Clock::now();
  for (int64_t step = 0; step < args.steps; ++step) {
    Clock::time_point train_end;
    absl::StatusOr<learner::StepResult> result =
        RunStep(args, engine, setup, &rng, &history, &train_end);
    if (!result.ok()) return result.status();
    if ((step + 1) % args.log_every == 0 || step + 1 == args.steps) {
      PrintProgress(step, args.log_every, history, *result, Seconds(start, train_end));
    }
  }
  PrintSummary(args, history, Seconds(start, Clock::now()));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  at::set_num_threads(args.threads);
  torch::manual_seed(args.seed);
  absl::StatusOr<Setup> setup = CreateSetup(args);
  if (!setup.ok()) return Fail(setup.status());
  PrintHeader(args, setup->sampling);
  const absl::Status status = Train(args, &*setup);
  if (!status.ok()) return Fail(status);
  return 0;
}
