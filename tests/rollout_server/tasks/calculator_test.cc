// The add_tool task and its calculator: what a turn ending with CALL is
// answered, and the verifier on transcripts with the calculator's answers.
#include "rollout_server/tasks/calculator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rollout_server/tasks/addition_task.h"
#include "tests/testing/status_matchers.h"

namespace asympo::rollout {
namespace {

using addition::DigitId;
using addition::kCallId;
using addition::kCommaId;
using addition::kEqualsId;
using addition::kPlusId;
using ::asympo::testing::StatusIs;
using synthetic::kEosId;
using ::testing::ElementsAre;

TEST(CalculatorTest, AnswersTheSumATurnWritesAndGoesOnFromIt) {
  std::optional<int32_t> previous;
  EXPECT_THAT(CalculatorAnswer({DigitId(2), DigitId(3), kPlusId, DigitId(4), DigitId(5), kCallId},
                               &previous),
              ElementsAre(kEqualsId, DigitId(6), DigitId(8)));
  EXPECT_EQ(previous, 68);
  EXPECT_THAT(CalculatorAnswer({kPlusId, DigitId(1), DigitId(7), kCallId}, &previous),
              ElementsAre(kEqualsId, DigitId(8), DigitId(5)));
  EXPECT_THAT(CalculatorAnswer(
                  {DigitId(9), DigitId(9), DigitId(9), DigitId(9), kPlusId, DigitId(1), kCallId},
                  &previous),
              ElementsAre(kEqualsId, DigitId(1), DigitId(0), DigitId(0), DigitId(0), DigitId(0)));
}

TEST(CalculatorTest, AnExpressionItCannotReadIsAnsweredWithAComma) {
  std::optional<int32_t> none;
  EXPECT_THAT(CalculatorAnswer({kPlusId, DigitId(1), kCallId}, &none), ElementsAre(kCommaId))
      << "a leading + before any answer";
  EXPECT_FALSE(none.has_value());
  for (const std::vector<int32_t>& bad : std::vector<std::vector<int32_t>>{
           {kCallId},
           {DigitId(1), kPlusId, kCallId},
           {DigitId(1), DigitId(2), DigitId(3), DigitId(4), DigitId(5), kCallId},
           {DigitId(1), kEqualsId, DigitId(2), kCallId}}) {
    std::optional<int32_t> previous = 5;
    EXPECT_THAT(CalculatorAnswer(bad, &previous), ElementsAre(kCommaId));
    EXPECT_EQ(previous, 5) << "an unread expression keeps the last answer";
  }
  std::optional<int32_t> previous;
  EXPECT_TRUE(CalculatorAnswer({DigitId(1), kEosId}, &previous).empty()) << "no CALL: no answer";
}

TEST(AdditionToolTaskTest, ServesAddsProblemsAsToolEpisodes) {
  TaskOptions o;
  o.name = "add_tool";
  o.vocab_size = 23;
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kInvalidArgument, "needs at least 24"));
  o.vocab_size = 64;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Task> task, CreateTask(o));
  EXPECT_EQ(task->name(), "add_tool");
  EXPECT_THAT(task->stop_token_ids(), ElementsAre(kEosId, kCallId));
  EXPECT_EQ(task->max_new_tokens(), 72);
  std::mt19937_64 rng(4);
  const TaskPrompt p = task->NextPrompt(rng);
  EXPECT_EQ(p.prompt_tokens[1], addition::kToolMarkerId);
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> operands, AdditionOperands(p));
  // The transcript of calls for every operand, answers inserted, then EOS.
  std::vector<int32_t> transcript;
  std::optional<int32_t> previous;
  for (size_t i = 0; i < operands.size(); ++i) {
    std::vector<int32_t> turn;
    if (i > 0) turn.push_back(kPlusId);
    AppendDigits(operands[i], &turn);
    turn.push_back(kCallId);
    const std::vector<int32_t> answer = CalculatorAnswer(turn, &previous);
    transcript.insert(transcript.end(), turn.begin(), turn.end());
    transcript.insert(transcript.end(), answer.begin(), answer.end());
  }
  transcript.push_back(kEosId);
  EXPECT_EQ(task->Score(p, transcript).reward, 1.0);
  transcript.insert(transcript.end() - 1, DigitId(1));  // a digit more: another number
  EXPECT_EQ(task->Score(p, transcript).reward, 0.0);
  // The held-out split is add's: the same problems, another marker.
  o.name = "add";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Task> add, CreateTask(o));
  const auto a = add->EvaluationPrompts(5), b = task->EvaluationPrompts(5);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].reference, b[i].reference);
}

}  // namespace
}  // namespace asympo::rollout
