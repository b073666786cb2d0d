#include "rollout_server/tasks/addition_task.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace asympo::rollout {
namespace {

using addition::DigitId;
using addition::IsDigitId;
using addition::kCommaId;
using addition::kEqualsId;
using addition::kMarkerId;
using addition::kPlusId;
using synthetic::Draw;
using synthetic::kBosId;
using synthetic::kEosId;
using synthetic::kSepId;
using synthetic::SplitMix;

constexpr uint64_t kHeldOutEvery = 4;
constexpr uint64_t kEvaluationSeed = 0xadd5eedULL;
constexpr int64_t kDefaultEvaluationPrompts = 1000;

// Whether a prompt belongs to the evaluation split: a fixed hash of its
// operands as a multiset (the same numbers in another order are the same
// problem), one in kHeldOutEvery.
bool HeldOut(std::vector<int32_t> operands) {
  std::sort(operands.begin(), operands.end());
  uint64_t h = SplitMix(0xadd0add0add0ULL);
  for (int32_t x : operands) h = SplitMix(h ^ static_cast<uint64_t>(x));
  return h % kHeldOutEvery == 0;
}

// The number spelled by the digit tokens [begin, end); -1 when empty, not
// all digits, longer than 4 digits or with a leading zero.
int32_t ReadNumber(const std::vector<int32_t>& t, size_t begin, size_t end) {
  if (begin >= end || end - begin > 4) return -1;
  if (end - begin > 1 && t[begin] == DigitId(0)) return -1;
  int32_t n = 0;
  for (size_t i = begin; i < end; ++i) {
    if (!IsDigitId(t[i])) return -1;
    n = n * 10 + (t[i] - DigitId(0));
  }
  return n;
}

// "add", or "add_tool" (`tool`): the same problems, with another marker,
// CALL as a second stop id (the end of a turn that calls the calculator)
// and room for the calculator's answers.
class AdditionTask : public Task {
 public:
  AdditionTask(int32_t min_k, int32_t max_k, bool tool)
      : min_k_(min_k), max_k_(max_k), tool_(tool) {}

  std::string_view name() const override { return tool_ ? "add_tool" : "add"; }

  TaskPrompt NextPrompt(std::mt19937_64& rng) override {
    std::vector<int32_t> operands = DrawOperands(rng);
    for (int tries = 0; HeldOut(operands) && tries < 1000; ++tries) operands = DrawOperands(rng);
    return MakePrompt(operands, absl::StrCat(tool_ ? "add_tool" : "add", "-", next_id_++));
  }

  std::vector<TaskPrompt> EvaluationPrompts(int64_t max) const override {
    if (max <= 0) max = kDefaultEvaluationPrompts;
    std::mt19937_64 rng(kEvaluationSeed);
    std::set<std::vector<int32_t>> seen;
    std::vector<TaskPrompt> out;
    for (int64_t tries = 0; static_cast<int64_t>(out.size()) < max && tries < 100 * max; ++tries) {
      std::vector<int32_t> operands = DrawOperands(rng);
      std::vector<int32_t> key = operands;
      std::sort(key.begin(), key.end());
      if (HeldOut(operands) && seen.insert(key).second) {
        out.push_back(
            MakePrompt(operands, absl::StrCat(tool_ ? "add_tool" : "add", "-eval-", out.size())));
      }
    }
    return out;
  }

  TaskScore Score(const TaskPrompt& prompt, const std::vector<int32_t>& response) const override {
    TaskScore score;
    absl::StatusOr<std::vector<int32_t>> operands = AdditionOperands(prompt);
    if (!operands.ok()) return score;
    const auto eos = std::find(response.begin(), response.end(), kEosId);
    if (eos == response.end()) return score;  // cut before its answer
    const size_t end = static_cast<size_t>(eos - response.begin());
    size_t begin = 0;
    for (size_t i = 0; i < end; ++i) {
      if (response[i] == kEqualsId) begin = i + 1;
    }
    const int32_t answer = ReadNumber(response, begin, end);
    score.correct = answer == std::accumulate(operands->begin(), operands->end(), 0);
    score.reward = score.correct ? 1.0 : 0.0;
    return score;
  }

  std::vector<int32_t> stop_token_ids() const override {
    if (tool_) return {kEosId, addition::kCallId};
    return {kEosId};
  }

  // The longest correct response (k = max_k, three-digit partial sums:
  // 2 + 7 (k - 1) + (k - 2) commas + EOS) and two tokens of slack; with
  // the calculator, twice that (its calls and answers: "a + b CALL = s",
  // then "+ c CALL = s" for each further operand).
  int32_t max_new_tokens() const override {
    const int32_t plain = 2 + 7 * (max_k_ - 1) + (max_k_ - 2) + 1 + 2;
    return tool_ ? 2 * plain : plain;
  }

  int64_t min_vocab_size() const override { return (tool_ ? addition::kCallId : kMarkerId) + 1; }

 private:
  std::vector<int32_t> DrawOperands(std::mt19937_64& rng) const {
    const int32_t k = min_k_ + Draw(rng, max_k_ - min_k_ + 1);
    std::vector<int32_t> operands(static_cast<size_t>(k));
    for (int32_t& x : operands) {
      x = addition::kMinOperand + Draw(rng, addition::kMaxOperand - addition::kMinOperand + 1);
    }
    return operands;
  }

  TaskPrompt MakePrompt(const std::vector<int32_t>& operands, std::string id) const {
    TaskPrompt p;
    p.prompt_id = std::move(id);
    p.prompt_tokens = {kBosId, tool_ ? addition::kToolMarkerId : kMarkerId};
    for (size_t i = 0; i < operands.size(); ++i) {
      if (i > 0) p.prompt_tokens.push_back(kPlusId);
      AppendDigits(operands[i], &p.prompt_tokens);
    }
    p.prompt_tokens.push_back(kSepId);
    p.reference = absl::StrCat("add ", absl::StrJoin(operands, " "));
    return p;
  }

  const int32_t min_k_;
  const int32_t max_k_;
  const bool tool_;
  int64_t next_id_ = 0;
};

}  // namespace

void AppendDigits(int64_t n, std::vector<int32_t>* out) {
  for (char c : std::to_string(n)) out->push_back(DigitId(c - '0'));
}

absl::StatusOr<std::unique_ptr<Task>> CreateAdditionTask(const TaskOptions& o) {
  const bool tool = o.name == "add_tool";
  const std::string name = tool ? "add_tool" : "add";
  if (!o.data_path.empty() || !o.tokenizer_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_path or tokenizer_path is set but task \"", name,
                     "\" is synthetic; only the math task reads them"));
  }
  if (o.synthetic_alphabet_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic_alphabet_size is ", o.synthetic_alphabet_size, "; task \"", name,
                     "\" has a fixed alphabet (digits, +, =, \",\"): leave it 0"));
  }
  const int32_t min_k =
      o.synthetic_min_length > 0 ? o.synthetic_min_length : addition::kDefaultMinOperands;
  const int32_t max_k =
      o.synthetic_max_length > 0 ? o.synthetic_max_length : addition::kDefaultMaxOperands;
  if (o.synthetic_min_length < 0 || o.synthetic_max_length < 0 || min_k < 2 || min_k > max_k ||
      max_k > addition::kMaxOperands) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task \"", name,
        "\": synthetic_min_length and synthetic_max_length (the number of "
        "operands) are ",
        min_k, " and ", max_k, "; they must satisfy 2 <= min <= max <= ", addition::kMaxOperands,
        " (0 keeps 3 and 5)"));
  }
  auto task = std::make_unique<AdditionTask>(min_k, max_k, tool);
  if (o.vocab_size < task->min_vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size is ", o.vocab_size, "; task \"", name, "\" needs at least ",
        task->min_vocab_size(), " (the reserved ids, 10 digits, +, =, \",\", its marker",
        tool ? " and CALL)" : ")"));
  }
  return task;
}

absl::StatusOr<std::vector<int32_t>> AdditionOperands(const TaskPrompt& prompt) {
  std::vector<absl::string_view> parts = absl::StrSplit(prompt.reference, ' ', absl::SkipEmpty());
  if (parts.size() < 2 || parts[0] != "add") {
    return absl::InvalidArgumentError(
        absl::StrCat("reference \"", prompt.reference.substr(0, 40), "\" is not an add task's"));
  }
  std::vector<int32_t> operands;
  for (size_t i = 1; i < parts.size(); ++i) {
    int32_t x = 0;
    if (!absl::SimpleAtoi(parts[i], &x) || x < 0 || x > 9999) {
      return absl::InvalidArgumentError(absl::StrCat("operand \"", parts[i], "\" of reference \"",
                                                     prompt.reference.substr(0, 40), "\""));
    }
    operands.push_back(x);
  }
  return operands;
}

std::vector<int32_t> AdditionSolution(const std::vector<int32_t>& operands,
                                      const std::vector<int32_t>& order) {
  std::vector<int32_t> out;
  int32_t sum = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    const int32_t x = operands[static_cast<size_t>(order[j])];
    sum += x;
    if (j == 0) {
      AppendDigits(x, &out);
      continue;
    }
    if (j > 1) out.push_back(kCommaId);
    out.push_back(kPlusId);
    AppendDigits(x, &out);
    out.push_back(kEqualsId);
    AppendDigits(sum, &out);
  }
  if (order.size() == 1) {
    out.push_back(kEqualsId);
    AppendDigits(sum, &out);
  }
  out.push_back(kEosId);
  return out;
}

std::vector<int32_t> RandomAdditionSolution(const std::vector<int32_t>& operands,
                                            std::mt19937_64& rng) {
  std::vector<int32_t> order(operands.size());
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with the portable draw.
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[static_cast<size_t>(Draw(rng, static_cast<int32_t>(i)))]);
  }
  return AdditionSolution(operands, order);
}

std::vector<int32_t> AdditionOrder(const std::vector<int32_t>& operands,
                                   const std::vector<int32_t>& response) {
  // The numbers the scratchpad adds: the first one, then each after a "+".
  std::vector<int32_t> added;
  size_t i = 0;
  const auto number_at = [&](size_t from) {
    size_t to = from;
    while (to < response.size() && IsDigitId(response[to])) ++to;
    return std::make_pair(ReadNumber(response, from, to), to);
  };
  auto [first, next] = number_at(0);
  if (first < 0) return {};
  added.push_back(first);
  for (i = next; i < response.size() && response[i] != kEosId; ++i) {
    if (response[i] != kPlusId) continue;
    auto [x, after] = number_at(i + 1);
    if (x < 0) return {};
    added.push_back(x);
    i = after - 1;
  }
  if (added.size() != operands.size()) return {};
  std::vector<int32_t> order;
  std::vector<bool> used(operands.size(), false);
  for (int32_t x : added) {
    size_t j = 0;
    while (j < operands.size() && (used[j] || operands[j] != x)) ++j;
    if (j == operands.size()) return {};
    used[j] = true;
    order.push_back(static_cast<int32_t>(j));
  }
  return order;
}

OrderEntropy AdditionOrderEntropy(const std::vector<int32_t>& operands,
                                  const std::vector<std::vector<int32_t>>& responses) {
  std::map<std::vector<int32_t>, int64_t> counts;
  OrderEntropy out;
  for (const std::vector<int32_t>& r : responses) {
    std::vector<int32_t> order = AdditionOrder(operands, r);
    if (order.empty()) continue;
    ++counts[std::move(order)];
    ++out.read;
  }
  if (out.read < 2) return out;
  for (const auto& [order, n] : counts) {
    const double p = static_cast<double>(n) / static_cast<double>(out.read);
    out.nats -= p * std::log(p);
  }
  return out;
}

}  // namespace asympo::rollout
