// Evaluation of a policy on a task's held-out prompts (Task::
// EvaluationPrompts), as the paper's tables report it:
//  - mean@k: the accuracy averaged over k samples per prompt, then over
//    prompts;
//  - pass@k: the fraction of prompts solved by at least one of k samples
//    (with n > k samples, the unbiased estimator 1 - C(n-c, k) / C(n, k)
//    where c of the n samples are correct);
//  - greedy accuracy and reward: one argmax response per prompt;
//  - mean response length (tokens, stop token included) of the samples
//    and of the greedy responses.
// asympo-eval (evaluate_main.cc) wraps it; bench/task_learning and
// bench/staleness call it in process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/tasks/tasks.h"

namespace asympo::rollout {

struct EvaluationOptions {
  // k: samples per prompt for mean@k and pass@k; 0 skips sampling (greedy
  // only).
  int32_t k = 8;
  // n >= k samples per prompt for the pass@k estimator (0: n = k).
  int32_t samples = 0;
  double temperature = 1.0;
  double top_p = 1.0;
  // 0: the task's own limit.
  int32_t max_new_tokens = 0;
  uint64_t seed = 0;
  // Prompts per Generate call (each brings 1 + n requests).
  int32_t prompts_per_batch = 32;
};

absl::Status ValidateEvaluationOptions(const EvaluationOptions& options);

struct PromptEvaluation {
  std::string prompt_id;
  std::vector<int32_t> greedy_tokens;
  double greedy_reward = 0;
  bool greedy_correct = false;
  int32_t samples_correct = 0;  // of n
  double sample_reward = 0;     // mean over n
};

struct EvaluationReport {
  int64_t prompts = 0;
  int32_t k = 0;
  int32_t samples = 0;  // n
  double temperature = 1.0;
  double mean_at_k = 0;
  double pass_at_k = 0;
  double sample_reward = 0;
  double greedy_accuracy = 0;
  double greedy_reward = 0;
  double mean_length = 0;         // of the samples
  double greedy_mean_length = 0;  // of the greedy responses
  double seconds = 0;
  std::vector<PromptEvaluation> per_prompt;
};

// Which weights to evaluate.
struct EvaluationModelSource {
  // "tiny" or a Hugging Face model directory (an --export_dir); empty: the
  // learner's --model recorded in the checkpoint, else "tiny".
  std::string model;
  // The tiny model's vocabulary; 0: the checkpoint's --tiny_vocab_size,
  // else 64.
  int64_t tiny_vocab_size = 0;
  // A learner checkpoint: one ckpt-<version> directory, or a checkpoint
  // root whose newest valid checkpoint is used. Empty: `model`'s own
  // weights.
  std::string checkpoint;
};

// The model with the chosen weights; `described` (if not null) receives a
// few words naming them ("checkpoint runs/x/ckpt-000000001200, version 1200").
absl::StatusOr<std::unique_ptr<PolicyModel>> LoadModelForEvaluation(
    const EvaluationModelSource& source, const ModelOptions& options, std::string* described);

// pass@k from n samples of which c are correct (0 <= c <= n, 1 <= k <= n).
double PassAtK(int64_t n, int64_t c, int64_t k);

// Generates greedy and sampled responses to `prompts` with `engine` and
// scores them with `task`. INVALID_ARGUMENT for bad options or no prompts;
// generation errors pass through.
absl::StatusOr<EvaluationReport> Evaluate(const GenerationEngine& engine, const Task& task,
                                          const std::vector<TaskPrompt>& prompts,
                                          const EvaluationOptions& options);

// The report as one JSON object (per-prompt results included when
// `per_prompt`).
std::string EvaluationJson(const EvaluationReport& report, bool per_prompt);

// One line: "greedy_acc=0.950 mean@8=0.912 pass@8=1.000 ...".
std::string EvaluationSummary(const EvaluationReport& report);

}  // namespace asympo::rollout
