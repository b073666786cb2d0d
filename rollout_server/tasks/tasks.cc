#include "rollout_server/tasks/tasks.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include <glog/logging.h>
#include <nlohmann/json.hpp>
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "rollout_server/tasks/addition_task.h"
#include "rollout_server/tasks/math_verifier.h"

namespace asympo::rollout {
namespace {

using synthetic::Draw;
using synthetic::kBosId;
using synthetic::kEosId;
using synthetic::kFirstMarkerId;
using synthetic::kFirstSymbolId;
using synthetic::kSepId;
using synthetic::SplitMix;

// ---------------------------------------------------------------------------
// Synthetic tasks.

// Maps the prompt's symbols (alphabet indices 0 .. a-1) to the target's.
using Transform = std::vector<int32_t> (*)(std::vector<int32_t> symbols, int32_t alphabet);

struct SyntheticSpec {
  const char* name;
  const char* description;
  int32_t marker;  // kFirstMarkerId + marker
  // Defaults, chosen so that the tiny model learns the task from a random
  // initialization within a few hundred steps (docs/tasks.md).
  int32_t alphabet;
  int32_t min_length;
  int32_t max_length;
  Transform transform;
};

std::vector<int32_t> Copy(std::vector<int32_t> s, int32_t) { return s; }

std::vector<int32_t> Reverse(std::vector<int32_t> s, int32_t) {
  std::reverse(s.begin(), s.end());
  return s;
}

std::vector<int32_t> Successor(std::vector<int32_t> s, int32_t alphabet) {
  for (int32_t& x : s) x = (x + 1) % alphabet;
  return s;
}

std::vector<int32_t> Sort(std::vector<int32_t> s, int32_t) {
  std::sort(s.begin(), s.end());
  return s;
}

constexpr SyntheticSpec kSyntheticTasks[] = {
    {"copy", "repeat the prompt's symbols, then EOS", 0, 4, 2, 4, Copy},
    {"reverse", "the prompt's symbols in reverse order, then EOS", 1, 4, 2, 4, Reverse},
    {"successor", "each symbol replaced by the next one (the last wraps to the first), then EOS", 2,
     4, 2, 4, Successor},
    {"sort", "the prompt's symbols in ascending order, then EOS", 3, 4, 2, 4, Sort},
};

class SyntheticTask : public Task {
 public:
  SyntheticTask(const SyntheticSpec& spec, int32_t alphabet, int32_t min_length, int32_t max_length)
      : spec_(spec),
        alphabet_(alphabet),
        min_length_(min_length),
        max_length_(max_length),
        sequences_(CountSequences(alphabet, min_length, max_length)) {}

  std::string_view name() const override { return spec_.name; }

  // Draws until the sequence is outside the evaluation split (a quarter
  // of the sequences; a handful of draws).
  TaskPrompt NextPrompt(std::mt19937_64& rng) override {
    std::vector<int32_t> symbols = DrawSymbols(rng);
    for (int tries = 0; HeldOut(symbols) && tries < 1000; ++tries) symbols = DrawSymbols(rng);
    return MakePrompt(std::move(symbols), absl::StrCat(spec_.name, "-", next_id_++));
  }

  // The evaluation split in a fixed order: every held-out sequence, by
  // length then lexicographically, when there are at most 2^16 sequences;
  // otherwise distinct held-out sequences drawn with a fixed seed.
  std::vector<TaskPrompt> EvaluationPrompts(int64_t max) const override {
    if (max <= 0) max = kDefaultEvaluationPrompts;
    std::vector<std::vector<int32_t>> picked;
    if (sequences_ <= (int64_t{1} << 16)) {
      for (int32_t n = min_length_; n <= max_length_; ++n) {
        std::vector<int32_t> s(n, 0);
        do {
          // A space too small to split evaluates on every sequence.
          if (sequences_ < 8 || HeldOut(s)) picked.push_back(s);
        } while (static_cast<int64_t>(picked.size()) < max && NextSequence(&s));
      }
    } else {
      std::mt19937_64 rng(kEvaluationSeed);
      std::set<std::vector<int32_t>> seen;
      for (int64_t tries = 0; static_cast<int64_t>(picked.size()) < max && tries < 100 * max;
           ++tries) {
        std::vector<int32_t> s = DrawSymbols(rng);
        if (HeldOut(s) && seen.insert(s).second) picked.push_back(std::move(s));
      }
    }
    if (static_cast<int64_t>(picked.size()) > max) picked.resize(static_cast<size_t>(max));
    std::vector<TaskPrompt> out;
    for (size_t i = 0; i < picked.size(); ++i) {
      out.push_back(MakePrompt(picked[i], absl::StrCat(spec_.name, "-eval-", i)));
    }
    return out;
  }

  TaskScore Score(const TaskPrompt& prompt, const std::vector<int32_t>& response) const override {
    std::vector<int32_t> expected;
    for (absl::string_view piece : absl::StrSplit(prompt.reference, ' ', absl::SkipEmpty())) {
      int32_t id = 0;
      // References come from NextPrompt; anything else is a caller's bug.
      CHECK(absl::SimpleAtoi(piece, &id))
          << name() << ": reference \"" << prompt.reference << "\" is not a list of token ids";
      expected.push_back(id);
    }
    expected.push_back(kEosId);
    // Position-wise agreement with (target, EOS), over the longer of the
    // two: a missing EOS, a wrong length or extra tokens all cost credit.
    const size_t common = std::min(expected.size(), response.size());
    int64_t matches = 0;
    for (size_t i = 0; i < common; ++i) matches += response[i] == expected[i] ? 1 : 0;
    TaskScore score;
    score.reward = static_cast<double>(matches) /
                   static_cast<double>(std::max(expected.size(), response.size()));
    score.correct = response == expected;
    return score;
  }

  std::vector<int32_t> stop_token_ids() const override { return {kEosId}; }

  // Room for the longest target, its EOS and one token more, so that
  // over-long responses exist and are penalized rather than cut.
  int32_t max_new_tokens() const override { return max_length_ + 2; }

  int64_t min_vocab_size() const override { return kFirstSymbolId + alphabet_; }

 private:
  static constexpr uint64_t kHeldOutEvery = 4;
  static constexpr uint64_t kEvaluationSeed = 0x5eed5eedULL;
  static constexpr int64_t kDefaultEvaluationPrompts = 1000;

  // Whether a sequence belongs to the evaluation split: a fixed hash of the
  // task and the symbols, one sequence in kHeldOutEvery. Spaces of fewer than
  // 8 sequences have no split (every sequence trains and evaluates).
  bool HeldOut(const std::vector<int32_t>& symbols) const {
    if (sequences_ < 8) return false;
    uint64_t h = SplitMix(static_cast<uint64_t>(spec_.marker) + 0x9e3779b97f4a7c15ULL);
    for (int32_t s : symbols) h = SplitMix(h ^ static_cast<uint64_t>(s + 1));
    return h % kHeldOutEvery == 0;
  }

  std::vector<int32_t> DrawSymbols(std::mt19937_64& rng) const {
    const int32_t n = min_length_ + Draw(rng, max_length_ - min_length_ + 1);
    std::vector<int32_t> symbols(n);
    for (int32_t& s : symbols) s = Draw(rng, alphabet_);
    return symbols;
  }

  // Sequences of every allowed length, saturating at 2^62.
  static int64_t CountSequences(int32_t alphabet, int32_t min_length, int32_t max_length) {
    int64_t total = 0, count = 1;
    for (int32_t n = 1; n <= max_length; ++n) {
      count = count > (int64_t{1} << 62) / alphabet ? (int64_t{1} << 62) : count * alphabet;
      if (n >= min_length) total = std::min(total + count, int64_t{1} << 62);
    }
    return total;
  }

  // The next sequence of the same length in lexicographic order; false
  // after the last.
  bool NextSequence(std::vector<int32_t>* s) const {
    for (size_t i = s->size(); i-- > 0;) {
      if (++(*s)[i] < alphabet_) return true;
      (*s)[i] = 0;
    }
    return false;
  }

  TaskPrompt MakePrompt(std::vector<int32_t> symbols, std::string prompt_id) const {
    const int32_t n = static_cast<int32_t>(symbols.size());
    TaskPrompt p;
    p.prompt_id = std::move(prompt_id);
    p.prompt_tokens.reserve(n + 3);
    p.prompt_tokens.push_back(kBosId);
    p.prompt_tokens.push_back(kFirstMarkerId + spec_.marker);
    for (int32_t s : symbols) p.prompt_tokens.push_back(kFirstSymbolId + s);
    p.prompt_tokens.push_back(kSepId);
    // The reference is the target's token ids, space-separated, EOS excluded.
    std::vector<int32_t> target = spec_.transform(std::move(symbols), alphabet_);
    for (int32_t& t : target) t += kFirstSymbolId;
    p.reference = absl::StrJoin(target, " ");
    return p;
  }

  const SyntheticSpec& spec_;
  const int32_t alphabet_;
  const int32_t min_length_;
  const int32_t max_length_;
  const int64_t sequences_;  // CountSequences
  int64_t next_id_ = 0;
};

absl::StatusOr<std::unique_ptr<Task>> CreateSynthetic(const SyntheticSpec& spec,
                                                      const TaskOptions& o) {
  for (const auto& [option, value] :
       {std::pair<const char*, const std::string*>{"data_path", &o.data_path},
        {"tokenizer_path", &o.tokenizer_path}}) {
    if (!value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(option, " is set but task \"", spec.name,
                       "\" is synthetic; only the math task reads it"));
    }
  }
  const int32_t alphabet =
      o.synthetic_alphabet_size > 0 ? o.synthetic_alphabet_size : spec.alphabet;
  const int32_t min_length = o.synthetic_min_length > 0 ? o.synthetic_min_length : spec.min_length;
  const int32_t max_length = o.synthetic_max_length > 0 ? o.synthetic_max_length : spec.max_length;
  if (o.synthetic_alphabet_size < 0 || alphabet < 2) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic_alphabet_size is ",
                                                   o.synthetic_alphabet_size,
                                                   "; it must be at least 2 (0: the default)"));
  }
  if (o.synthetic_min_length < 0 || o.synthetic_max_length < 0 || min_length > max_length ||
      max_length > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic_min_length and synthetic_max_length are ", min_length, " and ", max_length,
        " (0 keeps the default); they must satisfy 1 <= min <= max <= 64"));
  }
  const int64_t needed = kFirstSymbolId + alphabet;
  if (o.vocab_size < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size is ", o.vocab_size, "; task \"", spec.name, "\" with ", alphabet,
        " symbols needs at least ", needed, " (", kFirstSymbolId, " reserved ids + the alphabet)"));
  }
  return std::unique_ptr<Task>(new SyntheticTask(spec, alphabet, min_length, max_length));
}

// ---------------------------------------------------------------------------
// The math task.

struct MathRow {
  std::string prompt;
  std::string answer;
  int64_t line = 0;  // 1-based line in the JSONL file
};

absl::StatusOr<std::vector<MathRow>> ReadMathRows(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("data_path ", path, ": cannot open"));
  std::vector<MathRow> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = absl::StrCat(path, ":", line_no);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", e.what()));
    }
    if (!record.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": is ", record.type_name(), "; each line must be a JSON object"));
    }
    MathRow row;
    row.line = line_no;
    for (const auto& [field, out] :
         {std::pair<const char*, std::string*>{"prompt", &row.prompt}, {"answer", &row.answer}}) {
      auto it = record.find(field);
      if (it == record.end() || !it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": field \"", field, "\" is ",
                         it == record.end() ? std::string("missing") : std::string(it->type_name()),
                         "; it must be a string"));
      }
      *out = it->get<std::string>();
      if (absl::StripAsciiWhitespace(*out).empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": field \"", field, "\" is empty"));
      }
    }
    rows.push_back(std::move(row));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("data_path ", path, ": read failed"));
  if (rows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data_path ", path, ": holds no rows"));
  }
  return rows;
}

class MathTask : public Task {
 public:
  MathTask(std::vector<MathRow> rows, std::unique_ptr<Tokenizer> tokenizer,
           std::string prompt_template, int32_t stop_id, int32_t max_new_tokens)
      : rows_(std::move(rows)),
        tokenizer_(std::move(tokenizer)),
        template_(std::move(prompt_template)),
        stop_id_(stop_id),
        max_new_tokens_(max_new_tokens) {
    order_.resize(rows_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  }

  std::string_view name() const override { return "math"; }

  // Every row in file order: evaluate with the test split's file.
  std::vector<TaskPrompt> EvaluationPrompts(int64_t max) const override {
    std::vector<TaskPrompt> out;
    for (const MathRow& row : rows_) {
      if (max > 0 && static_cast<int64_t>(out.size()) >= max) break;
      out.push_back(Render(row));
    }
    return out;
  }

  TaskPrompt NextPrompt(std::mt19937_64& rng) override {
    if (cursor_ == 0 || cursor_ >= order_.size()) {
      // A new pass: Fisher-Yates with the portable draw.
      for (size_t i = order_.size(); i > 1; --i) {
        std::swap(order_[i - 1], order_[static_cast<size_t>(Draw(rng, static_cast<int32_t>(i)))]);
      }
      cursor_ = 0;
    }
    return Render(rows_[order_[cursor_++]]);
  }

  TaskScore Score(const TaskPrompt& prompt, const std::vector<int32_t>& response) const override {
    // Ids the tokenizer does not know (a model vocabulary larger than the
    // tokenizer's) make the response unreadable: no reward.
    absl::StatusOr<std::string> text = tokenizer_->Decode(response, /*skip_special_tokens=*/true);
    TaskScore score;
    if (!text.ok()) return score;
    score.reward = MathReward(*text, prompt.reference);
    score.correct = score.reward == 1.0;
    return score;
  }

  std::vector<int32_t> stop_token_ids() const override { return {stop_id_}; }
  int32_t max_new_tokens() const override { return max_new_tokens_; }
  int64_t min_vocab_size() const override { return tokenizer_->vocab_size(); }

 private:
  TaskPrompt Render(const MathRow& row) const {
    TaskPrompt p;
    p.prompt_id = absl::StrCat("math-", row.line);
    p.prompt_tokens =
        tokenizer_->Encode(absl::StrReplaceAll(template_, {{"{prompt}", row.prompt}}));
    p.reference = row.answer;
    return p;
  }

  const std::vector<MathRow> rows_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  const std::string template_;
  const int32_t stop_id_;
  const int32_t max_new_tokens_;
  std::vector<size_t> order_;
  size_t cursor_ = 0;
};

absl::StatusOr<std::unique_ptr<Task>> CreateMath(const TaskOptions& o) {
  if (o.data_path.empty()) {
    return absl::InvalidArgumentError("data_path is empty; the math task needs a JSONL file");
  }
  if (o.tokenizer_path.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer_path is empty; the math task needs a tokenizer.json");
  }
  if (o.math_max_new_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("math_max_new_tokens is ", o.math_max_new_tokens, "; it must be positive"));
  }
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                          Tokenizer::FromFile(o.tokenizer_path));
  if (tokenizer->vocab_size() > o.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size is ", o.vocab_size, " but the tokenizer at ", o.tokenizer_path, " has ",
        tokenizer->vocab_size(), " ids; the model's vocabulary must hold every tokenizer id"));
  }
  std::string prompt_template = o.prompt_template;
  if (prompt_template.empty()) {
    for (const char* needed : {"<|im_start|>", "<|im_end|>"}) {
      if (!tokenizer->TokenToId(needed).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prompt_template is empty and the tokenizer at ", o.tokenizer_path, " has no ", needed,
            " token for the default chat template; pass a template for this model"));
      }
    }
    prompt_template = kDefaultMathPromptTemplate;
  } else if (prompt_template.find("{prompt}") == std::string::npos) {
    return absl::InvalidArgumentError(
        "prompt_template has no \"{prompt}\"; it marks where the question goes");
  }
  int32_t stop_id = 0;
  if (!o.stop_token.empty()) {
    std::optional<int32_t> id = tokenizer->TokenToId(o.stop_token);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token \"", o.stop_token, "\" is not a token of ", o.tokenizer_path));
    }
    stop_id = *id;
  } else {
    std::optional<int32_t> id;
    for (const char* eos : {"<|im_end|>", "<|endoftext|>", "</s>"}) {
      id = tokenizer->TokenToId(eos);
      if (id.has_value()) break;
    }
    if (!id.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token is empty and the tokenizer at ", o.tokenizer_path,
          " has none of <|im_end|>, <|endoftext|>, </s>; name the token that ends a response"));
    }
    stop_id = *id;
  }
  ASYMPO_ASSIGN_OR_RETURN(std::vector<MathRow> rows, ReadMathRows(o.data_path));
  return std::unique_ptr<Task>(new MathTask(std::move(rows), std::move(tokenizer),
                                            std::move(prompt_template), stop_id,
                                            o.math_max_new_tokens));
}

}  // namespace

namespace synthetic {

int32_t Draw(std::mt19937_64& rng, int32_t n) {
  return static_cast<int32_t>(rng() % static_cast<uint64_t>(n));
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace synthetic

std::vector<std::pair<std::string, std::string>> TaskNames() {
  std::vector<std::pair<std::string, std::string>> names;
  for (const SyntheticSpec& spec : kSyntheticTasks) {
    names.emplace_back(spec.name, absl::StrCat("synthetic: ", spec.description));
  }
  names.emplace_back("add",
                     "synthetic: add 3 to 5 two-digit numbers, a scratchpad of running sums in any "
                     "order of the operands, reward 1 when the final answer is the sum");
  names.emplace_back("add_tool",
                     "synthetic, multi-turn: add, with a calculator the model may call for its "
                     "sums (\"a + b CALL\" is answered \"= s\"); reward on the final answer");
  names.emplace_back("math",
                     "JSONL {\"prompt\", \"answer\"} rows through a chat template and a "
                     "tokenizer.json; reward 1 when the final answer matches");
  return names;
}

absl::StatusOr<std::unique_ptr<Task>> CreateTask(const TaskOptions& options) {
  if (options.vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size is ", options.vocab_size, "; it must be positive"));
  }
  if (options.name == "math") return CreateMath(options);
  if (options.name == "add" || options.name == "add_tool") return CreateAdditionTask(options);
  for (const SyntheticSpec& spec : kSyntheticTasks) {
    if (options.name == spec.name) return CreateSynthetic(spec, options);
  }
  ASYMPO_RETURN_IF_ERROR(CheckTaskFlag(options.name));
  return absl::InternalError(absl::StrCat("task ", options.name, " is listed but not built"));
}

absl::Status CheckTaskFlag(const std::string& name) {
  std::vector<std::string> known;
  for (const auto& [task, description] : TaskNames()) {
    if (task == name) return absl::OkStatus();
    known.push_back(task);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--task=", name, ": no such task; the tasks are ", absl::StrJoin(known, ", ")));
}

}  // namespace asympo::rollout
