#include "learner_server/loss/token_logprobs.h"
#include "tests/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

TEST(TokenLogProbsTest, EqualsLogSoftmaxAtTheTargetOnRealTokens) {
  torch::manual_seed(1);
  const torch::Tensor logits = torch::randn({3, 4, 11}, torch::kDouble);
  const torch::Tensor targets = torch::randint(0, 11, {3, 4}, torch::kLong);
  const torch::Tensor mask =
      torch::tensor({{1, 1, 1, 1}, {1, 1, 0, 0}, {1, 0, 0, 0}}, torch::kBool);
  const torch::Tensor l = TokenLogProbs(logits, targets, mask).value();
  const torch::Tensor ref =
      torch::log_softmax(logits, 2).gather(2, targets.unsqueeze(2)).squeeze(2);
  EXPECT_TRUE(torch::allclose(l.masked_select(mask), ref.masked_select(mask), 0, 1e-14));
  EXPECT_EQ(l.masked_select(mask.logical_not()).abs().sum().item<double>(), 0.0);
}

TEST(TokenLogProbsTest, GradientMatchesTheLogSoftmaxPath) {
  torch::manual_seed(2);
  torch::Tensor logits = torch::randn({2, 3, 7}, torch::kDouble).requires_grad_(true);
  const torch::Tensor targets = torch::randint(0, 7, {2, 3}, torch::kLong);
  const torch::Tensor mask = torch::tensor({{1, 1, 0}, {1, 1, 1}}, torch::kBool);
  const torch::Tensor w = torch::randn({2, 3}, torch::kDouble);
  const torch::Tensor g1 = torch::autograd::grad(
      {(TokenLogProbs(logits, targets, mask).value() * w).sum()}, {logits})[0];
  const torch::Tensor ref =
      torch::log_softmax(logits, 2).gather(2, targets.unsqueeze(2)).squeeze(2);
  const torch::Tensor g2 =
      torch::autograd::grad({(ref * w * mask.to(torch::kDouble)).sum()}, {logits})[0];
  EXPECT_TRUE(torch::allclose(g1, g2, 0, 1e-14));
}

TEST(TokenLogProbsTest, IgnoresAnyIdInPadding) {
  const torch::Tensor logits = torch::randn({1, 3, 5});
  const torch::Tensor targets = torch::tensor({{1, -100, 99}}, torch::kLong);
  const torch::Tensor mask = torch::tensor({{1, 0, 0}}, torch::kBool);
  EXPECT_OK(TokenLogProbs(logits, targets, mask));
}

TEST(TokenLogProbsTest, RejectsOutOfVocabularyTargetsAndBadShapes) {
  const torch::Tensor logits = torch::randn({1, 2, 5});
  const torch::Tensor mask = torch::ones({1, 2}, torch::kBool);
  EXPECT_THAT(
      TokenLogProbs(logits, torch::tensor({{1, 5}}, torch::kLong), mask),
      StatusIs(absl::StatusCode::kInvalidArgument, "target id 5 is outside the vocabulary [0, 5)"));
  EXPECT_THAT(TokenLogProbs(logits, torch::tensor({{1, 2, 3}}, torch::kLong), mask),
              StatusIs(absl::StatusCode::kInvalidArgument, "targets must have shape (1, 2)"));
  EXPECT_THAT(TokenLogProbs(logits, torch::tensor({{1, 2}}, torch::kLong), torch::ones({2, 2})),
              StatusIs(absl::StatusCode::kInvalidArgument, "mask must have shape (1, 2)"));
  EXPECT_THAT(TokenLogProbs(torch::randn({2, 5}), torch::tensor({{1, 2}}), mask),
              StatusIs(absl::StatusCode::kInvalidArgument, "logits must be a floating (N, T, V)"));
}

TEST(PadSequencesTest, RightPadsToTheLongestWithAMask) {
  const PaddedSequences p = PadSequences({{5, 6, 7}, {8}, {}}, /*pad_id=*/0);
  EXPECT_TRUE(torch::equal(p.ids, torch::tensor({{5, 6, 7}, {8, 0, 0}, {0, 0, 0}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(p.mask, torch::tensor({{1, 1, 1}, {1, 0, 0}, {0, 0, 0}}, torch::kBool)));
}

}  // namespace
}  // namespace asympo::learner
