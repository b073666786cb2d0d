#include "learner_server/trainer/micro_batches.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;

// A group of `prompt` tokens 1..prompt and one response per length in
// `responses`, response r of tokens 10 + r, rewarded r.
QueuedGroup Group(int prompt, const std::vector<int>& responses) {
  QueuedGroup q;
  for (int t = 1; t <= prompt; ++t) q.group.add_prompt_tokens(t);
  for (size_t r = 0; r < responses.size(); ++r) {
    v1::Response* resp = q.group.add_responses();
    for (int t = 0; t < responses[r]; ++t) {
      resp->add_tokens(10 + static_cast<int>(r));
      resp->add_behavior_logprobs(-0.5f * static_cast<float>(r + 1));
    }
    resp->set_reward(static_cast<float>(r));
  }
  return q;
}

PaddedLayoutOptions LayoutOptions(int64_t budget) {
  PaddedLayoutOptions o;
  o.micro_batch_tokens = budget;
  o.vocab_size = 32;
  o.pad_token_id = 0;
  return o;
}

TEST(PaddedLayoutTest, SplitsWholeGroupsInOrderWithinThePaddedBudget) {
  // Padded sizes: 2 rows x 5, 2 x 4, 2 x 7, 3 x 9 (alone over the budget).
  const std::vector<QueuedGroup> groups = {Group(3, {2, 1}), Group(2, {2, 2}), Group(4, {3, 1}),
                                           Group(5, {4, 4, 1})};
  const auto split = PaddedLayout(LayoutOptions(20)).Split(groups);
  ASSERT_EQ(split.size(), 3u);
  // 4 rows x 5 = 20 fits; a third group makes 6 x 7 = 42.
  EXPECT_THAT(split[0], ElementsAre(&groups[0], &groups[1]));
  EXPECT_THAT(split[1], ElementsAre(&groups[2]));  // 5 rows x 9 = 45 with the next
  EXPECT_THAT(split[2], ElementsAre(&groups[3]));  // 27 > 20: a micro-batch of its own
}

TEST(PaddedLayoutTest, LaysOutPaddedRowsWhosePredictorsPointAtTheResponseTokens) {
  const std::vector<QueuedGroup> groups = {Group(2, {2, 1}), Group(1, {3})};
  PaddedLayoutOptions o = LayoutOptions(100);
  o.pad_token_id = 31;
  o.behavior_logprobs = true;
  const MicroBatch mb = PaddedLayout(o).Build({&groups[0], &groups[1]}).value();
  EXPECT_EQ(mb.rows, 3);
  EXPECT_EQ(mb.longest, 4);  // prompt 1 + response 3
  EXPECT_EQ(mb.longest_response, 3);
  EXPECT_EQ(mb.groups, 2);
  EXPECT_TRUE(torch::equal(
      mb.ids,
      torch::tensor({1, 2, 10, 10, 1, 2, 11, 31, 1, 10, 10, 10}, torch::kLong).view({3, 4})));
  EXPECT_TRUE(torch::equal(mb.positions, torch::arange(4, torch::kLong).repeat({3, 1})));
  EXPECT_TRUE(torch::equal(mb.key_mask, mb.ids != 31));
  EXPECT_TRUE(torch::equal(
      mb.response_mask,
      torch::tensor({1, 1, 0, 1, 0, 0, 1, 1, 1}, torch::kLong).view({3, 3}).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(mb.rewards, torch::tensor({0.0f, 1.0f, 0.0f})));
  EXPECT_TRUE(torch::equal(mb.group_index, torch::tensor({0, 0, 1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(
      mb.behavior,
      torch::tensor({-0.5f, -0.5f, 0.0f, -1.0f, 0.0f, 0.0f, -0.5f, -0.5f, -0.5f}).view({3, 3})));
  // Row r, position P - 1 + j predicts response token j.
  EXPECT_THAT(mb.hidden_rows, ElementsAre(1, 2, 5, 8, 9, 10));
  EXPECT_THAT(mb.targets, ElementsAre(10, 10, 11, 10, 10, 10));
}

TEST(PaddedLayoutTest, TokensTheEnvironmentInsertedAreContextButNeverTargets) {
  // Response 0: 4 tokens, the middle two inserted (a tool's answer); its
  // behavior log-probs are for the two generated ones.
  std::vector<QueuedGroup> groups = {Group(2, {4, 1})};
  v1::Response* r = groups[0].group.mutable_responses(0);
  r->set_tokens(1, 20);
  r->set_tokens(2, 21);
  for (const bool g : {true, false, false, true}) r->add_loss_mask(g);
  r->clear_behavior_logprobs();
  r->add_behavior_logprobs(-0.25f);
  r->add_behavior_logprobs(-0.75f);
  PaddedLayoutOptions o = LayoutOptions(100);
  o.behavior_logprobs = true;
  for (const bool packed : {false, true}) {
    const MicroBatch mb = packed ? PackedLayout(o).Build({&groups[0]}).value()
                                 : PaddedLayout(o).Build({&groups[0]}).value();
    SCOPED_TRACE(packed ? "packed" : "padded");
    // The inserted tokens are in the sequence, attended to like any other.
    EXPECT_EQ((mb.ids == 20).logical_and(mb.key_mask).sum().item<int64_t>(), 1);
    EXPECT_EQ((mb.ids == 21).logical_and(mb.key_mask).sum().item<int64_t>(), 1);
    // But they are neither targets nor in the response mask.
    EXPECT_TRUE(torch::equal(
        mb.response_mask,
        torch::tensor({1, 0, 0, 1, 1, 0, 0, 0}, torch::kLong).view({2, 4}).to(torch::kBool)));
    EXPECT_THAT(mb.targets, ElementsAre(10, 10, 11));
    EXPECT_EQ(mb.hidden_rows.size(), 3u);
    EXPECT_TRUE(torch::equal(
        mb.behavior,
        torch::tensor({-0.25f, 0.0f, 0.0f, -0.75f, -1.0f, 0.0f, 0.0f, 0.0f}).view({2, 4})));
  }
}

TEST(PaddedLayoutTest, ATokenOutsideTheVocabularyIsAnInvalidBatch) {
  std::vector<QueuedGroup> groups = {Group(2, {2, 2})};
  groups[0].group.mutable_responses(1)->set_tokens(0, 32);
  EXPECT_THAT(PaddedLayout(LayoutOptions(100)).Build({&groups[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument, "token 32 is outside"));
}

TEST(PackedLayoutTest, SplitsWholeGroupsInOrderByRealTokens) {
  // Real tokens: 3+2 + 3+1 = 9, 2+2 + 2+2 = 8, 4+3 + 4+1 = 12, 5+4 + 5+4 + 5+1 = 24.
  const std::vector<QueuedGroup> groups = {Group(3, {2, 1}), Group(2, {2, 2}), Group(4, {3, 1}),
                                           Group(5, {4, 4, 1})};
  const auto split = PackedLayout(LayoutOptions(20)).Split(groups);
  ASSERT_EQ(split.size(), 3u);
  EXPECT_THAT(split[0], ElementsAre(&groups[0], &groups[1]));  // 17; 29 with the next
  EXPECT_THAT(split[1], ElementsAre(&groups[2]));
  EXPECT_THAT(split[2], ElementsAre(&groups[3]));  // 24 > 20: a micro-batch of its own
  // Padded, the first two groups would take 4 rows x 5 = 20 and the third
  // 6 x 7: packing fits what padding cannot.
  EXPECT_EQ(PaddedLayout(LayoutOptions(16)).Split(groups).size(), 4u);
  EXPECT_EQ(PackedLayout(LayoutOptions(17)).Split(groups).size(), 3u);
}

TEST(PackedLayoutTest, PacksLongestFirstWithPositionsAndSegmentsOfTheirOwn) {
  // Sequences (prompt + response) r0..r3: 2+2 = 4, 2+1 = 3 (group 0); 1+5
  // = 6, 1+2 = 3 (group 1). Rows of 6, longest first, first fit: r2 fills
  // row 0, r0 opens row 1, r1 does not fit beside it (4 + 3) and opens row
  // 2, where r3 follows it.
  const std::vector<QueuedGroup> groups = {Group(2, {2, 1}), Group(1, {5, 2})};
  PaddedLayoutOptions o = LayoutOptions(100);
  o.pad_token_id = 31;
  o.behavior_logprobs = true;
  const MicroBatch mb = PackedLayout(o).Build({&groups[0], &groups[1]}).value();
  EXPECT_EQ(mb.responses, 4);
  EXPECT_EQ(mb.rows, 3);
  EXPECT_EQ(mb.longest, 6);
  EXPECT_EQ(mb.longest_response, 5);
  EXPECT_EQ(mb.real_tokens, 16);
  EXPECT_TRUE(torch::equal(mb.ids, torch::tensor({1, 10, 10, 10, 10, 10,  // r2
                                                  1, 2, 10, 10, 31, 31,   // r0
                                                  1, 2, 11, 1, 11, 11},   // r1, r3
                                                 torch::kLong)
                                       .view({3, 6})));
  EXPECT_TRUE(torch::equal(mb.positions, torch::tensor({0, 1, 2, 3, 4, 5,  //
                                                        0, 1, 2, 3, 4, 5,  // padding: its column
                                                        0, 1, 2, 0, 1, 2},
                                                       torch::kLong)
                                             .view({3, 6})));
  EXPECT_TRUE(torch::equal(mb.segments, torch::tensor({2, 2, 2, 2, 2, 2,    //
                                                       0, 0, 0, 0, -1, -1,  //
                                                       1, 1, 1, 3, 3, 3},
                                                      torch::kLong)
                                            .view({3, 6})));
  EXPECT_TRUE(torch::equal(mb.key_mask, mb.segments >= 0));
  EXPECT_TRUE(torch::equal(mb.group_index, torch::tensor({0, 0, 1, 1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(mb.rewards, torch::tensor({0.0f, 1.0f, 0.0f, 1.0f})));
  // In response order: r0 (row 1, from 1), r1 (row 2, from 1), r2 (row 0,
  // from 0), r3 (row 2, from 3 + 0).
  EXPECT_THAT(mb.hidden_rows, ElementsAre(7, 8, 13, 0, 1, 2, 3, 4, 15, 16));
  EXPECT_THAT(mb.targets, ElementsAre(10, 10, 11, 10, 10, 10, 10, 10, 11, 11));
  EXPECT_EQ(mb.response_mask.sum().item<int64_t>(), 10);
  EXPECT_FLOAT_EQ(mb.behavior[3][1].item<float>(), -1.0f);
}

TEST(PackedLayoutTest, RefusesMissingBehaviorLogProbsWhenTheObjectiveNeedsThem) {
  std::vector<QueuedGroup> groups = {Group(2, {2, 1})};
  groups[0].group.mutable_responses(0)->mutable_behavior_logprobs()->RemoveLast();
  PaddedLayoutOptions o = LayoutOptions(100);
  o.behavior_logprobs = true;
  for (const bool packed : {false, true}) {
    const auto mb =
        packed ? PackedLayout(o).Build({&groups[0]}) : PaddedLayout(o).Build({&groups[0]});
    EXPECT_THAT(mb, StatusIs(absl::StatusCode::kInvalidArgument,
                             "response 0 has 1 behavior log-probs for 2 generated tokens"));
  }
  o.behavior_logprobs = false;  // not read
  EXPECT_TRUE(PackedLayout(o).Build({&groups[0]}).ok());
}

TEST(PackedLayoutTest, RefusesALossMaskThatIsNotOnePerToken) {
  // Admission refuses it; a group read back from a checkpoint is laid out
  // unchecked by admission, so the layout checks what it indexes.
  std::vector<QueuedGroup> groups = {Group(2, {2, 1})};
  groups[0].group.mutable_responses(1)->add_loss_mask(true);
  groups[0].group.mutable_responses(1)->add_loss_mask(false);
  for (const bool packed : {false, true}) {
    const auto mb = packed ? PackedLayout(LayoutOptions(100)).Build({&groups[0]})
                           : PaddedLayout(LayoutOptions(100)).Build({&groups[0]});
    EXPECT_THAT(mb, StatusIs(absl::StatusCode::kInvalidArgument,
                             "response 1 has a loss_mask of 2 entries for 1 tokens"));
  }
}

TEST(PackedLayoutTest, RefusesATokenOutsideTheVocabulary) {
  std::vector<QueuedGroup> groups = {Group(2, {2, 1})};
  groups[0].group.mutable_responses(1)->set_tokens(0, 32);
  EXPECT_THAT(PackedLayout(LayoutOptions(100)).Build({&groups[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument, "token 32 is outside"));
}

}  // namespace
}  // namespace asympo::learner
