// A base model made here: supervised training of the policy on a task's
// reference solutions (for "add", correct scratchpads in random operand
// orders), stopped once the held-out greedy accuracy reaches a target, and
// the statistics that say whether the base suits the paper's regime (its
// responses' mean token NLL S_g, and how far apart 1/S_g lies within a
// group). Used by bench/task_learning (--sft_steps, --save_model,
// --init_model); docs/tasks.md, "A base model for add".
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "rollout_server/tasks/tasks.h"

namespace asympo::bench {

struct SftOptions {
  // At most this many optimizer steps; stops earlier once the greedy
  // accuracy on `eval_prompts` held-out prompts, checked every `eval_every`
  // steps, is at least `target_accuracy`.
  int64_t max_steps = 3000;
  double target_accuracy = 0.4;
  int64_t eval_every = 50;
  int64_t eval_prompts = 200;
  // Sequences (prompt + one reference response) per step, AdamW's learning
  // rate (constant) and the gradient-norm clip.
  int64_t batch = 32;
  double lr = 1e-3;
  double max_grad_norm = 1.0;
  uint64_t seed = 0;
};

struct SftResult {
  int64_t steps = 0;
  double accuracy = 0;   // the last evaluation's greedy accuracy
  double last_loss = 0;  // mean token NLL of the last step's references
  bool reached = false;  // accuracy >= target_accuracy
  double seconds = 0;
};

// One correct response for `prompt`, EOS included: for "add" a scratchpad
// in an operand order drawn from `rng`; for the other synthetic tasks the
// reference's ids. UNIMPLEMENTED for tasks without references (math).
absl::StatusOr<std::vector<int32_t>> ReferenceResponse(const rollout::Task& task,
                                                       const rollout::TaskPrompt& prompt,
                                                       std::mt19937_64& rng);

// Trains `model` in place: the mean token NLL of reference responses given
// their prompts (the prompts' tokens are not trained), AdamW. Prints a line
// per evaluation.
absl::StatusOr<SftResult> RunSft(PolicyModel* model, rollout::Task* task,
                                 const SftOptions& options);

// The mean over every response token of log pi_behavior - log pi_model:
// with `behavior_logprobs` the sampler's log-probs of its own tokens
// (temperature 1), an unbiased estimate of KL(behavior || model) per token,
// the drift between the weights that sampled and the weights that train.
absl::StatusOr<double> MeanTokenKl(const PolicyModel& model,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   const std::vector<std::vector<int32_t>>& responses,
                                   const std::vector<std::vector<float>>& behavior_logprobs);

// What sampling from a model gives, as the objectives see it: S, a
// response's mean token NLL under the policy (temperature 1), over
// `prompts` groups of `group` samples, and per group the ratio of the
// largest 1/S to the smallest (how unevenly ASymPO's 1/S_g weighs a group's
// responses).
struct BaseStatistics {
  int64_t responses = 0;
  double s_median = 0, s_p10 = 0, s_p90 = 0;
  double ratio_median = 0, ratio_p90 = 0;
  double accuracy = 0;  // of the samples
};
absl::StatusOr<BaseStatistics> MeasureBase(const PolicyModel& model, rollout::Task* task,
                                           int64_t prompts, int64_t group, uint64_t seed);

// "S_g median 0.35 (p10 0.21, p90 0.58) nats; ...", one line.
std::string BaseStatisticsLine(const BaseStatistics& s);

}  // namespace asympo::bench
