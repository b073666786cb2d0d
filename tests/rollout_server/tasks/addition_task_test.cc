#include "rollout_server/tasks/addition_task.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace asympo::rollout {
namespace {

using addition::DigitId;
using ::asympo::testing::StatusIs;
using synthetic::kBosId;
using synthetic::kEosId;
using synthetic::kSepId;

constexpr int32_t P = addition::kPlusId;
constexpr int32_t E = addition::kEqualsId;
constexpr int32_t C = addition::kCommaId;

std::unique_ptr<Task> MakeAdditionTask(int32_t min_k = 0, int32_t max_k = 0) {
  TaskOptions o;
  o.name = "add";
  o.vocab_size = 64;
  o.synthetic_min_length = min_k;
  o.synthetic_max_length = max_k;
  absl::StatusOr<std::unique_ptr<Task>> t = CreateTask(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TaskPrompt PromptOf(const std::vector<int32_t>& operands) {
  TaskPrompt p;
  p.prompt_id = "add-test";
  p.reference = "add";
  for (int32_t x : operands) p.reference += " " + std::to_string(x);
  return p;
}

TEST(AdditionTaskTest, DigitTokensSpellNumbersMostSignificantFirst) {
  for (int32_t d = 0; d <= 9; ++d) {
    EXPECT_EQ(DigitId(d), synthetic::kFirstSymbolId + d);
    EXPECT_TRUE(addition::IsDigitId(DigitId(d)));
  }
  EXPECT_FALSE(addition::IsDigitId(DigitId(0) - 1));
  EXPECT_FALSE(addition::IsDigitId(DigitId(10)));
  EXPECT_FALSE(addition::IsDigitId(P));
  std::vector<int32_t> out = {kBosId};
  AppendDigits(305, &out);
  AppendDigits(0, &out);
  AppendDigits(99999, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{kBosId, DigitId(3), DigitId(0), DigitId(5), DigitId(0),
                                       DigitId(9), DigitId(9), DigitId(9), DigitId(9), DigitId(9)}))
      << "appended after what was there";
}

TEST(AdditionTaskTest, PromptsSpellTheOperandsAndStayInTheVocabulary) {
  std::unique_ptr<Task> task = MakeAdditionTask();
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "add");
  EXPECT_EQ(task->min_vocab_size(), addition::kMarkerId + 1);
  std::mt19937_64 rng(7), again(7);
  std::map<size_t, int> by_k;
  for (int i = 0; i < 300; ++i) {
    const TaskPrompt p = task->NextPrompt(rng);
    EXPECT_EQ(p.prompt_tokens, task->NextPrompt(again).prompt_tokens) << "a seed gives the prompts";
    ASSERT_GE(p.prompt_tokens.size(), 4u);
    EXPECT_EQ(p.prompt_tokens.front(), kBosId);
    EXPECT_EQ(p.prompt_tokens[1], addition::kMarkerId);
    EXPECT_EQ(p.prompt_tokens.back(), kSepId);
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> operands, AdditionOperands(p));
    ++by_k[operands.size()];
    // BOS ADD a1 + a2 + ... + ak SEP, two digits each.
    EXPECT_EQ(p.prompt_tokens.size(), 3 + 2 * operands.size() + operands.size() - 1);
    for (size_t j = 0; j < operands.size(); ++j) {
      EXPECT_GE(operands[j], 10);
      EXPECT_LE(operands[j], 99);
      EXPECT_EQ(p.prompt_tokens[2 + 3 * j], DigitId(operands[j] / 10));
      EXPECT_EQ(p.prompt_tokens[3 + 3 * j], DigitId(operands[j] % 10));
      if (j + 1 < operands.size()) {
        EXPECT_EQ(p.prompt_tokens[4 + 3 * j], P);
      }
    }
    for (int32_t id : p.prompt_tokens) EXPECT_LT(id, task->min_vocab_size());
  }
  EXPECT_EQ(by_k.size(), 3u) << "k = 3, 4 and 5";
  EXPECT_EQ(by_k.begin()->first, 3u);
}

TEST(AdditionTaskTest, EveryOrderOfTheScratchpadIsCorrectAndOfReasoningLength) {
  std::unique_ptr<Task> task = MakeAdditionTask();
  const std::vector<int32_t> ops = {23, 45, 17};
  const TaskPrompt p = PromptOf(ops);
  // The example of the header: 45 + 17 = 62 , + 23 = 85.
  const std::vector<int32_t> example = {
      DigitId(4), DigitId(5), P, DigitId(1), DigitId(7), E,     DigitId(6), DigitId(2), C, P,
      DigitId(2), DigitId(3), E, DigitId(8), DigitId(5), kEosId};
  EXPECT_EQ(AdditionSolution(ops, {1, 2, 0}), example);
  std::vector<int32_t> order = {0, 1, 2};
  std::set<std::vector<int32_t>> responses;
  do {
    const std::vector<int32_t> r = AdditionSolution(ops, order);
    responses.insert(r);
    const TaskScore s = task->Score(p, r);
    EXPECT_TRUE(s.correct);
    EXPECT_EQ(s.reward, 1.0);
    EXPECT_EQ(AdditionOrder(ops, r), order);
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(responses.size(), 6u) << "k! distinct correct responses";

  // Lengths: 16 to 34 tokens for k = 3..5, all within max_new_tokens.
  std::mt19937_64 rng(3);
  size_t shortest = 1000, longest = 0;
  for (int i = 0; i < 2000; ++i) {
    const TaskPrompt q = task->NextPrompt(rng);
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> operands, AdditionOperands(q));
    const std::vector<int32_t> r = RandomAdditionSolution(operands, rng);
    EXPECT_TRUE(task->Score(q, r).correct);
    shortest = std::min(shortest, r.size());
    longest = std::max(longest, r.size());
  }
  EXPECT_GE(shortest, 16u);
  EXPECT_LE(longest, 34u);
  EXPECT_GE(longest, 30u);
  EXPECT_GE(task->max_new_tokens(), 34);
}

TEST(AdditionTaskTest, OnlyTheFinalAnswerIsRewarded) {
  std::unique_ptr<Task> task = MakeAdditionTask();
  const TaskPrompt p = PromptOf({23, 45, 17});
  const auto score = [&](std::vector<int32_t> r) { return task->Score(p, r).reward; };
  EXPECT_EQ(score({DigitId(8), DigitId(5), kEosId}), 1.0) << "the answer alone, no scratchpad";
  EXPECT_EQ(score({DigitId(1), P, DigitId(1), E, DigitId(8), DigitId(5), kEosId}), 1.0)
      << "the scratchpad is not checked";
  EXPECT_EQ(score({DigitId(8), DigitId(6), kEosId}), 0.0) << "a wrong answer";
  EXPECT_EQ(score({DigitId(2), DigitId(3), P, DigitId(4), DigitId(5), E, DigitId(8), DigitId(5)}),
            0.0)
      << "no EOS: cut";
  EXPECT_EQ(score({DigitId(0), DigitId(8), DigitId(5), kEosId}), 0.0) << "a leading zero";
  EXPECT_EQ(score({DigitId(8), DigitId(5), E, kEosId}), 0.0) << "nothing after the last =";
  EXPECT_EQ(score({DigitId(8), P, DigitId(5), kEosId}), 0.0) << "not a number";
  EXPECT_EQ(score({kEosId}), 0.0);
  EXPECT_EQ(score({}), 0.0);
  EXPECT_EQ(score({DigitId(8), DigitId(5), kEosId, DigitId(1)}), 1.0)
      << "what follows EOS is not the answer";
  // Another task's prompt scores 0 rather than crashing.
  TaskPrompt other;
  other.reference = "9 10 11";
  EXPECT_EQ(task->Score(other, {DigitId(8), DigitId(5), kEosId}).reward, 0.0);
  EXPECT_THAT(AdditionOperands(other), StatusIs(absl::StatusCode::kInvalidArgument, "add"));
}

TEST(AdditionTaskTest, TheOrderOfAScratchpadIsReadBack) {
  const std::vector<int32_t> ops = {23, 45, 23};
  // Equal operands: each is taken once, in the response's order.
  EXPECT_EQ(AdditionOrder(ops, AdditionSolution(ops, {2, 1, 0})), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(AdditionOrder(ops, AdditionSolution(ops, {1, 0, 2})), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_TRUE(AdditionOrder(ops, {DigitId(9), DigitId(1), kEosId}).empty()) << "the answer alone";
  EXPECT_TRUE(AdditionOrder(ops, {DigitId(2), DigitId(3), P, DigitId(4), DigitId(5), E, DigitId(6),
                                  DigitId(8), kEosId})
                  .empty())
      << "one operand missing";
  EXPECT_TRUE(
      AdditionOrder({10, 20}, {DigitId(1), DigitId(1), P, DigitId(2), DigitId(0), kEosId}).empty())
      << "a number that is no operand";
}

TEST(AdditionTaskTest, TheEntropyOfTheOrdersInAGroup) {
  const std::vector<int32_t> ops = {23, 45, 17};
  const std::vector<int32_t> a = AdditionSolution(ops, {0, 1, 2});
  const std::vector<int32_t> b = AdditionSolution(ops, {2, 1, 0});
  OrderEntropy one = AdditionOrderEntropy(ops, {a, a, a, a});
  EXPECT_EQ(one.read, 4);
  EXPECT_DOUBLE_EQ(one.nats, 0.0) << "one order";
  OrderEntropy two = AdditionOrderEntropy(ops, {a, b, a, b, {DigitId(8), DigitId(5), kEosId}});
  EXPECT_EQ(two.read, 4) << "the bare answer has no order";
  EXPECT_NEAR(two.nats, std::log(2.0), 1e-12);
  std::vector<std::vector<int32_t>> all;
  std::vector<int32_t> order = {0, 1, 2};
  do all.push_back(AdditionSolution(ops, order));
  while (std::next_permutation(order.begin(), order.end()));
  EXPECT_NEAR(AdditionOrderEntropy(ops, all).nats, std::log(6.0), 1e-12) << "the most: ln k!";
  EXPECT_EQ(AdditionOrderEntropy(ops, {a}).nats, 0.0);
}

TEST(AdditionTaskTest, HeldOutProblemsAreNeverServedInAnyOrder) {
  std::unique_ptr<Task> task = MakeAdditionTask();
  const std::vector<TaskPrompt> eval = task->EvaluationPrompts(0);
  ASSERT_EQ(eval.size(), 1000u);
  EXPECT_EQ(task->EvaluationPrompts(0)[17].prompt_tokens, eval[17].prompt_tokens) << "fixed";
  std::set<std::vector<int32_t>> held;
  for (const TaskPrompt& p : eval) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ops, AdditionOperands(p));
    std::sort(ops.begin(), ops.end());
    EXPECT_TRUE(held.insert(ops).second) << "distinct problems";
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 20000; ++i) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ops, AdditionOperands(task->NextPrompt(rng)));
    std::sort(ops.begin(), ops.end());
    ASSERT_EQ(held.count(ops), 0u) << "a held-out problem was served for training";
  }
  EXPECT_EQ(task->EvaluationPrompts(10).size(), 10u);
}

TEST(AdditionTaskTest, OptionsAreCheckedByName) {
  TaskOptions o;
  o.name = "add";
  o.vocab_size = 21;
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kInvalidArgument, "needs at least 22"));
  o.vocab_size = 64;
  o.synthetic_alphabet_size = 8;
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kInvalidArgument, "fixed alphabet"));
  o.synthetic_alphabet_size = 0;
  o.synthetic_min_length = 1;
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kInvalidArgument, "2 <= min <= max <= 10"));
  o.synthetic_min_length = 0;
  o.synthetic_max_length = 11;
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kInvalidArgument, "2 <= min <= max <= 10"));
  o.synthetic_max_length = 0;
  o.data_path = "x.jsonl";
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kInvalidArgument, "synthetic"));
  // k fixed by the options.
  std::unique_ptr<Task> two = MakeAdditionTask(2, 2);
  std::mt19937_64 rng(1);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ops, AdditionOperands(two->NextPrompt(rng)));
  EXPECT_EQ(ops.size(), 2u);
  EXPECT_EQ(two->max_new_tokens(), 2 + 7 + 1 + 2);
}

}  // namespace
}  // namespace asympo::rollout
