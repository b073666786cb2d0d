#include "rollout_server/evaluation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/checkpoint_files.h"
#include "common/model/model_io.h"
#include "common/status_macros.h"
#include "rollout_server/episodes/episode_runner.h"

namespace asympo::rollout {
namespace {

// A request's seed from the run's seed, the prompt's index and the sample's:
// the same prompt gets the same samples whatever the batching.
uint64_t SampleSeed(uint64_t seed, size_t prompt, int32_t sample) {
  uint64_t x = seed ^ (static_cast<uint64_t>(prompt) * 0x9e3779b97f4a7c15ULL) ^
               (static_cast<uint64_t>(sample) << 40);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Sums over prompts, divided at the end.
struct Totals {
  double mean_at_k = 0, pass_at_k = 0, sample_reward = 0;
  double greedy_correct = 0, greedy_reward = 0;
  double sample_tokens = 0, greedy_tokens = 0;
};

// Prompts [begin, end): one greedy request and n sampled ones each.
std::vector<GenerationRequest> Requests(const std::vector<TaskPrompt>& prompts, size_t begin,
                                        size_t end, const SamplingParams& base, int32_t n,
                                        const EvaluationOptions& options) {
  std::vector<GenerationRequest> requests;
  for (size_t p = begin; p < end; ++p) {
    requests.push_back(GenerationRequest{prompts[p].prompt_tokens, base});
    requests.back().params.temperature = 0;  // greedy
    for (int32_t j = 0; j < n; ++j) {
      requests.push_back(GenerationRequest{prompts[p].prompt_tokens, base});
      requests.back().params.seed = SampleSeed(options.seed, p, j);
    }
  }
  return requests;
}

// Scores one prompt's greedy response and samples (results[0] and
// results[1 .. n]) into `out` and `totals`.
void ScorePrompt(const Task& task, const TaskPrompt& prompt, const GenerationResult* results,
                 int32_t n, int32_t k, PromptEvaluation* out, Totals* totals) {
  out->prompt_id = prompt.prompt_id;
  out->greedy_tokens.assign(results[0].tokens.begin(), results[0].tokens.end());
  const TaskScore greedy = task.Score(prompt, results[0].tokens);
  out->greedy_reward = greedy.reward;
  out->greedy_correct = greedy.correct;
  totals->greedy_correct += greedy.correct ? 1 : 0;
  totals->greedy_reward += greedy.reward;
  totals->greedy_tokens += static_cast<double>(results[0].tokens.size());
  if (n == 0) return;
  double reward = 0;
  for (int32_t j = 1; j <= n; ++j) {
    const TaskScore s = task.Score(prompt, results[j].tokens);
    out->samples_correct += s.correct ? 1 : 0;
    reward += s.reward;
    totals->sample_tokens += static_cast<double>(results[j].tokens.size());
  }
  out->sample_reward = reward / n;
  totals->mean_at_k += static_cast<double>(out->samples_correct) / n;
  totals->pass_at_k += PassAtK(n, out->samples_correct, k);
  totals->sample_reward += out->sample_reward;
}

// The checkpoint directory `path` names: itself when it holds meta.json,
// else the newest valid ckpt-* under it.
absl::StatusOr<CheckpointContents> ReadNamedCheckpoint(const std::string& path,
                                                       std::string* chosen) {
  absl::StatusOr<CheckpointContents> direct = ReadCheckpointDirectory(path);
  if (direct.ok() || !absl::IsNotFound(direct.status())) {
    *chosen = path;
    return direct;
  }
  std::string skipped;
  for (const std::string& dir : ListCheckpoints(path)) {
    absl::StatusOr<CheckpointContents> contents = ReadCheckpointDirectory(dir);
    if (contents.ok()) {
      *chosen = dir;
      return contents;
    }
    absl::StrAppend(&skipped, "; skipped ", dir, ": ", contents.status().message());
  }
  return absl::NotFoundError(absl::StrCat("--checkpoint ", path,
                                          ": neither a checkpoint directory (meta.json) nor a "
                                          "root holding a valid ckpt-* directory",
                                          skipped));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PolicyModel>> LoadModelForEvaluation(
    const EvaluationModelSource& source, const ModelOptions& options, std::string* described) {
  std::string model = source.model;
  int64_t vocab = source.tiny_vocab_size;
  std::optional<CheckpointContents> contents;
  std::string chosen;
  if (!source.checkpoint.empty()) {
    ASYMPO_ASSIGN_OR_RETURN(contents, ReadNamedCheckpoint(source.checkpoint, &chosen));
    if (model.empty()) model = CheckpointConfigFlag(contents->config, "model");
    if (vocab == 0) {
      const std::string recorded = CheckpointConfigFlag(contents->config, "tiny_vocab_size");
      if (!recorded.empty() && !absl::SimpleAtoi(recorded, &vocab)) vocab = 0;
    }
  }
  if (model.empty()) model = "tiny";
  if (vocab <= 0) vocab = 64;
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<PolicyModel> policy,
                          CreateOrLoadPolicyModel(model, vocab, options));
  std::string what = model == "tiny" ? absl::StrCat("tiny model (vocabulary ", vocab, ")")
                                     : absl::StrCat("model ", model);
  if (contents.has_value()) {
    if (absl::Status s = policy->LoadParameters(contents->weights); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", chosen, " does not fit the ", what,
                       " (pass --model and, for the tiny "
                       "model, --tiny_vocab_size as the learner had them): ",
                       s.message()));
    }
    what = absl::StrCat(what, ", checkpoint ", chosen, " (version ", contents->version, ")");
  }
  if (described != nullptr) *described = what;
  return policy;
}

absl::Status ValidateEvaluationOptions(const EvaluationOptions& o) {
  if (o.k < 0) return absl::InvalidArgumentError(absl::StrCat("k is ", o.k, "; it must be >= 0"));
  if (o.samples != 0 && o.samples < o.k) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples is ", o.samples, "; it must be 0 (= k) or at least k = ", o.k));
  }
  if (o.prompts_per_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompts_per_batch is ", o.prompts_per_batch, "; it must be positive"));
  }
  if (o.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens is ", o.max_new_tokens, "; it must be >= 0"));
  }
  SamplingParams params;
  params.temperature = o.temperature;
  params.top_p = o.top_p;
  params.max_new_tokens = 1;
  return ValidateSamplingParams(params);
}

double PassAtK(int64_t n, int64_t c, int64_t k) {
  if (n - c < k) return 1.0;
  // 1 - prod_{i = n-c+1}^{n} (1 - k / i), stable for large n.
  double none = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) {
    none *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  }
  return 1.0 - none;
}

namespace {

// Turns of an evaluation episode (a task with a built-in environment).
constexpr int32_t kEvaluationMaxTurns = 8;

// The responses to `requests`: one sampling each, or, for a task with a
// built-in environment (add_tool), one episode each against it (the
// response is the transcript, which the task's verifier scores).
absl::StatusOr<std::vector<GenerationResult>> GenerateFor(
    const GenerationEngine& engine, const Task& task,
    const std::vector<GenerationRequest>& requests) {
  std::unique_ptr<Environment> environment = CreateBuiltinEnvironment(&task);
  if (environment == nullptr) return engine.Generate(requests);
  return RunRequestEpisodes(*engine.model(), std::move(environment), requests, kEvaluationMaxTurns);
}

}  // namespace

absl::StatusOr<EvaluationReport> Evaluate(const GenerationEngine& engine, const Task& task,
                                          const std::vector<TaskPrompt>& prompts,
                                          const EvaluationOptions& options) {
  if (absl::Status s = ValidateEvaluationOptions(options); !s.ok()) return s;
  if (prompts.empty()) return absl::InvalidArgumentError("no prompts to evaluate");
  const auto start = std::chrono::steady_clock::now();
  const int32_t n = options.k == 0 ? 0 : (options.samples > 0 ? options.samples : options.k);
  SamplingParams base;
  base.temperature = options.temperature;
  base.top_p = options.top_p;
  base.max_new_tokens = options.max_new_tokens > 0 ? options.max_new_tokens : task.max_new_tokens();
  base.stop_token_ids = task.stop_token_ids();

  EvaluationReport report;
  report.prompts = static_cast<int64_t>(prompts.size());
  report.k = options.k;
  report.samples = n;
  report.temperature = options.temperature;
  report.per_prompt.resize(prompts.size());
  Totals totals;
  for (size_t begin = 0; begin < prompts.size();
       begin += static_cast<size_t>(options.prompts_per_batch)) {
    const size_t end =
        std::min(prompts.size(), begin + static_cast<size_t>(options.prompts_per_batch));
    absl::StatusOr<std::vector<GenerationResult>> results =
        GenerateFor(engine, task, Requests(prompts, begin, end, base, n, options));
    if (!results.ok()) return results.status();
    for (size_t p = begin; p < end; ++p) {
      ScorePrompt(task, prompts[p], &(*results)[(p - begin) * (1 + n)], n, options.k,
                  &report.per_prompt[p], &totals);
    }
  }
  const double count = static_cast<double>(prompts.size());
  report.mean_at_k = totals.mean_at_k / count;
  report.pass_at_k = totals.pass_at_k / count;
  report.sample_reward = totals.sample_reward / count;
  report.greedy_accuracy = totals.greedy_correct / count;
  report.greedy_reward = totals.greedy_reward / count;
  report.greedy_mean_length = totals.greedy_tokens / count;
  report.mean_length = n > 0 ? totals.sample_tokens / (count * n) : 0;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string EvaluationJson(const EvaluationReport& r, bool per_prompt) {
  nlohmann::json j = {
      {"prompts", r.prompts},
      {"k", r.k},
      {"samples", r.samples},
      {"temperature", r.temperature},
      {"mean_at_k", r.mean_at_k},
      {"pass_at_k", r.pass_at_k},
      {"sample_reward", r.sample_reward},
      {"greedy_accuracy", r.greedy_accuracy},
      {"greedy_reward", r.greedy_reward},
      {"mean_length", r.mean_length},
      {"greedy_mean_length", r.greedy_mean_length},
      {"seconds", r.seconds},
  };
  if (per_prompt) {
    nlohmann::json rows = nlohmann::json::array();
    for (const PromptEvaluation& p : r.per_prompt) {
      rows.push_back({{"prompt_id", p.prompt_id},
                      {"greedy_tokens", p.greedy_tokens},
                      {"greedy_reward", p.greedy_reward},
                      {"greedy_correct", p.greedy_correct},
                      {"samples_correct", p.samples_correct},
                      {"sample_reward", p.sample_reward}});
    }
    j["per_prompt"] = std::move(rows);
  }
  return j.dump(2);
}

std::string EvaluationSummary(const EvaluationReport& r) {
  std::string line = absl::StrFormat("prompts=%d greedy_acc=%.3f greedy_reward=%.3f", r.prompts,
                                     r.greedy_accuracy, r.greedy_reward);
  if (r.samples > 0) {
    absl::StrAppendFormat(&line, " mean@%d=%.3f pass@%d=%.3f sample_reward=%.3f", r.k, r.mean_at_k,
                          r.k, r.pass_at_k, r.sample_reward);
  }
  absl::StrAppendFormat(&line, " greedy_length=%.2f", r.greedy_mean_length);
  if (r.samples > 0) absl::StrAppendFormat(&line, " mean_length=%.2f", r.mean_length);
  return line;
}

}  // namespace asympo::rollout
