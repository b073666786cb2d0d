// Tasks: where prompts come from and how responses are scored.
//
// A task draws prompts (already tokenized) and scores a sampled response
// against the prompt's reference with a verifier. Rewards are in [0, 1]
// (partial credit allowed); `correct` is exact-match success, reported as
// accuracy beside the reward.
//
// Built-in tasks:
//  - synthetic tasks over the tiny model's vocabulary, learnable from a random
//    initialization on a CPU in minutes (the embedded default). A prompt is
//    [BOS, task marker, s_1 .. s_n, SEP] over a small alphabet of symbol ids;
//    the expected response is the task's transform of s_1 .. s_n, then EOS.
//    The reward is the fraction of positions of (target, EOS) that the
//    response matches, over the longer of the two; `correct` is an exact
//    match, EOS included. docs/tasks.md describes each task.
//  - "math": JSONL rows {"prompt": ..., "answer": ...} rendered through a
//    prompt template and a Hugging Face tokenizer.json, scored by the math
//    verifier (rollout_server/tasks/math_verifier.h).
//
// NextPrompt is called from one thread; Score is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace asympo::rollout {

// Token ids of the synthetic tasks (the tiny model has no tokenizer).
namespace synthetic {
inline constexpr int32_t kPadId = 0;
inline constexpr int32_t kBosId = 1;
inline constexpr int32_t kEosId = 2;
inline constexpr int32_t kSepId = 3;
// Ids 4 .. 7 mark the task (one marker per task), so that prompts of
// different tasks never look alike.
inline constexpr int32_t kFirstMarkerId = 4;
// Symbol i of the alphabet is kFirstSymbolId + i.
inline constexpr int32_t kFirstSymbolId = 8;

// A uniform draw from [0, n). Modulo of a 64-bit draw rather than
// std::uniform_int_distribution, whose algorithm differs between standard
// libraries: a seed gives the same prompts everywhere.
int32_t Draw(std::mt19937_64& rng, int32_t n);
// SplitMix64's finalizer: the fixed hash that picks held-out prompts.
uint64_t SplitMix(uint64_t x);
}  // namespace synthetic

// The math task's prompt template when TaskOptions.prompt_template is empty:
// a Qwen-style chat turn (needs <|im_start|> and <|im_end|> in the tokenizer).
inline constexpr char kDefaultMathPromptTemplate[] =
    "<|im_start|>user\n{prompt}\nPut the final answer in \\boxed{}.<|im_end|>\n"
    "<|im_start|>assistant\n";

struct TaskPrompt {
  // Stable identifier, e.g. "copy-1234" or "math-17" (the JSONL line).
  std::string prompt_id;
  std::vector<int32_t> prompt_tokens;
  // What the verifier compares against (task-specific encoding).
  std::string reference;
};

struct TaskScore {
  double reward = 0;  // in [0, 1]
  bool correct = false;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string_view name() const = 0;
  // Draws the next training prompt from `rng`.
  virtual TaskPrompt NextPrompt(std::mt19937_64& rng) = 0;
  // Held-out prompts for evaluation, in a fixed order, at most `max` (0: the
  // task's default, up to 1000 for synthetic tasks, every row for math).
  // Synthetic tasks set aside a quarter of their sequences, chosen by a fixed
  // hash, that NextPrompt never serves; math returns its data file's rows
  // (give it the test split).
  virtual std::vector<TaskPrompt> EvaluationPrompts(int64_t max) const = 0;
  // Scores one response (the sampled tokens, stop token included if any).
  virtual TaskScore Score(const TaskPrompt& prompt, const std::vector<int32_t>& response) const = 0;
  // Ids that end a response.
  virtual std::vector<int32_t> stop_token_ids() const = 0;
  // Response length the task needs (the daemon's default max_new_tokens).
  virtual int32_t max_new_tokens() const = 0;
  // The smallest vocabulary the task's token ids fit in.
  virtual int64_t min_vocab_size() const = 0;
};

struct TaskOptions {
  // A name from TaskNames().
  std::string name;
  // The model's vocabulary size; INVALID_ARGUMENT when the task needs more.
  int64_t vocab_size = 0;
  // Synthetic tasks: symbols in the alphabet and the range of prompt lengths
  // (in symbols); 0 keeps the task's default (docs/tasks.md). The alphabet
  // must fit in the vocabulary after the reserved ids.
  int32_t synthetic_alphabet_size = 0;
  int32_t synthetic_min_length = 0;
  int32_t synthetic_max_length = 0;
  // math: JSONL file of {"prompt", "answer"} rows (string fields; other
  // fields are ignored; blank lines are skipped), the tokenizer.json, and
  // the template with "{prompt}" where the question goes (empty:
  // kDefaultMathPromptTemplate). Rows are served in a shuffled order,
  // reshuffled each pass. Synthetic tasks refuse data_path and
  // tokenizer_path (a forgotten --task=math) and ignore the rest.
  std::string data_path;
  std::string tokenizer_path;
  std::string prompt_template;
  // math: the id that ends a response (empty: the tokenizer's EOS, e.g.
  // <|im_end|> or <|endoftext|>).
  std::string stop_token;
  int32_t math_max_new_tokens = 512;
};

// Names of the built-in tasks with a one-line description each.
std::vector<std::pair<std::string, std::string>> TaskNames();

// Builds a task. Errors name the bad option, file, line or field.
absl::StatusOr<std::unique_ptr<Task>> CreateTask(const TaskOptions& options);

// OK when `name` is one of TaskNames(), else INVALID_ARGUMENT
// "--task=NAME: no such task; the tasks are ..." (the programs check it
// before they load a model or bind anything).
absl::Status CheckTaskFlag(const std::string& name);

}  // namespace asympo::rollout
