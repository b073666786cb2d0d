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
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include "common/model/model_config.h"
#include "common/model/policy_model.h"
#include "learner_server/trainer.h"
#include "rollout_server/generation.h"
#include "rollout_server/tasks.h"

namespace {

std::string FlagS(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return def;
}
int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string v = FlagS(argc, argv, name, "");
  return v.empty() ? def : std::atoll(v.c_str());
}
double FlagD(int argc, char** argv, const char* name, double def) {
  const std::string v = FlagS(argc, argv, name, "");
  return v.empty() ? def : std::atof(v.c_str());
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  end = std::min(end, v.size());
  if (begin >= end) return 0;
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "task_learning: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  namespace rollout = asympo::rollout;
  namespace learner = asympo::learner;
  const std::string task_name = FlagS(argc, argv, "--task", "copy");
  const int64_t steps = Flag(argc, argv, "--steps", 300);
  const int64_t prompts = Flag(argc, argv, "--prompts", 8);
  const int64_t group = Flag(argc, argv, "--group", 8);
  const double lr = FlagD(argc, argv, "--lr", 3e-3);
  const double temperature = FlagD(argc, argv, "--temperature", 1.0);
  const std::string objective_name = FlagS(argc, argv, "--objective", "asympo");
  const int64_t max_new_tokens_flag = Flag(argc, argv, "--max_new_tokens", 0);
  const int64_t vocab = Flag(argc, argv, "--vocab", 64);
  const uint64_t seed = static_cast<uint64_t>(Flag(argc, argv, "--seed", 0));
  const int64_t log_every = std::max<int64_t>(1, Flag(argc, argv, "--log_every", 10));
  at::set_num_threads(static_cast<int>(Flag(argc, argv, "--threads", 1)));
  torch::manual_seed(seed);

  rollout::TaskOptions task_options;
  task_options.name = task_name;
  task_options.vocab_size = vocab;
  task_options.synthetic_alphabet_size = static_cast<int32_t>(Flag(argc, argv, "--alphabet", 0));
  task_options.synthetic_min_length = static_cast<int32_t>(Flag(argc, argv, "--min_length", 0));
  task_options.synthetic_max_length = static_cast<int32_t>(Flag(argc, argv, "--max_length", 0));
  absl::StatusOr<std::unique_ptr<rollout::Task>> task = rollout::CreateTask(task_options);
  if (!task.ok()) return Fail(task.status());

  asympo::ModelOptions model_options;
  model_options.seed = seed;
  absl::StatusOr<std::unique_ptr<asympo::PolicyModel>> model =
      asympo::PolicyModel::CreateRandom(asympo::ModelConfig::Tiny(vocab), model_options);
  if (!model.ok()) return Fail(model.status());

  learner::TrainerOptions trainer_options;
  absl::StatusOr<learner::Objective> objective = learner::ParseObjective(objective_name);
  if (!objective.ok()) return Fail(objective.status());
  trainer_options.loss.objective = *objective;
  trainer_options.lr.peak_lr = lr;
  absl::StatusOr<std::unique_ptr<learner::Trainer>> trainer =
      learner::Trainer::Create(trainer_options, model->get(), /*publisher=*/nullptr);
  if (!trainer.ok()) return Fail(trainer.status());

  rollout::SamplingParams sampling;
  sampling.temperature = temperature;
  sampling.max_new_tokens = max_new_tokens_flag > 0 ? static_cast<int32_t>(max_new_tokens_flag)
                                                    : (*task)->max_new_tokens();
  sampling.stop_token_ids = (*task)->stop_token_ids();
  sampling.return_logprobs = *objective == learner::Objective::kGrpo;
  const rollout::GenerationEngine engine(model->get());

  std::printf(
      "task=%s objective=%s lr=%g prompts=%lld group=%lld temperature=%g max_new_tokens=%d "
      "vocab=%lld seed=%llu threads=%d\n",
      task_name.c_str(), objective_name.c_str(), lr, static_cast<long long>(prompts),
      static_cast<long long>(group), temperature, sampling.max_new_tokens,
      static_cast<long long>(vocab), static_cast<unsigned long long>(seed), at::get_num_threads());
  std::printf("%6s %8s %8s %8s %8s %8s\n", "step", "reward", "acc", "length", "nll", "seconds");

  std::mt19937_64 rng(seed);
  std::vector<double> rewards, accuracies;
  double gen_seconds = 0, train_seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    const auto gen_start = std::chrono::steady_clock::now();
    std::vector<rollout::TaskPrompt> batch;
    std::vector<rollout::GenerationRequest> requests;
    for (int64_t p = 0; p < prompts; ++p) {
      batch.push_back((*task)->NextPrompt(rng));
      for (int64_t g = 0; g < group; ++g) {
        rollout::GenerationRequest r;
        r.prompt = batch.back().prompt_tokens;
        r.params = sampling;
        r.params.seed = rng();
        requests.push_back(std::move(r));
      }
    }
    absl::StatusOr<std::vector<rollout::GenerationResult>> results = engine.Generate(requests);
    if (!results.ok()) return Fail(results.status());

    std::vector<learner::QueuedGroup> groups(prompts);
    double reward_sum = 0, correct = 0;
    for (int64_t p = 0; p < prompts; ++p) {
      asympo::v1::PromptGroup& pg = groups[p].group;
      pg.set_prompt_id(batch[p].prompt_id);
      pg.mutable_prompt_tokens()->Add(batch[p].prompt_tokens.begin(), batch[p].prompt_tokens.end());
      int64_t tokens = 0;
      for (int64_t g = 0; g < group; ++g) {
        const rollout::GenerationResult& res = (*results)[p * group + g];
        const rollout::TaskScore score = (*task)->Score(batch[p], res.tokens);
        asympo::v1::Response* r = pg.add_responses();
        r->mutable_tokens()->Add(res.tokens.begin(), res.tokens.end());
        r->mutable_behavior_logprobs()->Add(res.logprobs.begin(), res.logprobs.end());
        r->set_reward(static_cast<float>(score.reward));
        r->set_finish_reason(res.finish_reason);
        reward_sum += score.reward;
        correct += score.correct ? 1 : 0;
        tokens += static_cast<int64_t>(batch[p].prompt_tokens.size() + res.tokens.size());
      }
      groups[p].tokens = tokens;
      groups[p].arrival_version = (*trainer)->version();
    }
    const auto train_start = std::chrono::steady_clock::now();
    absl::StatusOr<learner::StepResult> result = (*trainer)->Step(std::move(groups));
    if (!result.ok()) return Fail(result.status());
    const auto train_end = std::chrono::steady_clock::now();
    gen_seconds += std::chrono::duration<double>(train_start - gen_start).count();
    train_seconds += std::chrono::duration<double>(train_end - train_start).count();

    const double n = static_cast<double>(prompts * group);
    rewards.push_back(reward_sum / n);
    accuracies.push_back(correct / n);
    if ((step + 1) % log_every == 0 || step + 1 == steps) {
      const size_t end = rewards.size(), begin = end - std::min<size_t>(end, log_every);
      std::printf("%6lld %8.3f %8.3f %8.2f %8.3f %8.1f\n", static_cast<long long>(step + 1),
                  Mean(rewards, begin, end), Mean(accuracies, begin, end),
                  result->diagnostics.mean_response_length, result->diagnostics.mean_nll,
                  std::chrono::duration<double>(train_end - start).count());
      std::fflush(stdout);
    }
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t k = std::min<size_t>(20, rewards.size());
  std::printf(
      "summary task=%s steps=%lld first20_reward=%.3f last20_reward=%.3f first20_acc=%.3f "
      "last20_acc=%.3f seconds=%.1f generate_s=%.1f train_s=%.1f\n",
      task_name.c_str(), static_cast<long long>(steps), Mean(rewards, 0, k),
      Mean(rewards, rewards.size() - k, rewards.size()), Mean(accuracies, 0, k),
      Mean(accuracies, accuracies.size() - k, accuracies.size()), total, gen_seconds,
      train_seconds);
  return 0;
}
