#include "common/batch_validation.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"

#include <cmath>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace asympo {
namespace {

using ::asympo::testing::RolloutBatchBuilder;
using ::asympo::testing::StatusIs;

BatchLimits Limits() {
  BatchLimits l;
  l.vocab_size = 100;
  l.min_group_size = 2;
  l.max_group_size = 4;
  l.max_prompt_tokens = 8;
  l.max_response_tokens = 6;
  l.max_groups_per_batch = 3;
  return l;
}

// Groups "p0", "p1" of prompt {1, 2}; response r holds {10 + r, 99}, and
// only the first is rewarded.
v1::RolloutBatch ValidBatch() {
  return RolloutBatchBuilder(2, 3)
      .Source("test")
      .ResponseTokens([](int, int r) {
        return std::vector<int32_t>{10 + r, 99};
      })
      .Rewards([](int, int r) { return r == 0 ? 1.0f : 0.0f; })
      .Build();
}

struct Case {
  const char* name;
  std::function<void(v1::RolloutBatch*, BatchLimits*)> mutate;
  const char* message;
};

class InvalidBatchTest : public ::testing::TestWithParam<Case> {};

TEST_P(InvalidBatchTest, IsRejectedWithAMessageNamingGroupAndRule) {
  v1::RolloutBatch batch = ValidBatch();
  BatchLimits limits = Limits();
  GetParam().mutate(&batch, &limits);
  const absl::Status s = ValidateRolloutBatch(batch, limits);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(Rules, InvalidBatchTest,
                         ::testing::
                             Values(Case{"NoGroups",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->clear_groups();
                                         },
                                         "batch has no groups"},
                                    Case{"TooManyGroups",
                                         [](v1::RolloutBatch* b, BatchLimits* l) {
                                           l->max_groups_per_batch = 1;
                                         },
                                         "batch has 2 groups, more than max_groups_per_batch 1"},
                                    Case{"LongSource",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->set_source(std::string(200, 'x'));
                                         },
                                         "batch source is 200 bytes"},
                                    Case{"LongBatchId",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->set_batch_id(std::string(129, 'z'));
                                         },
                                         "batch_id is 129 bytes, more than 128"},
                                    Case{"LongPromptId",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(1)->set_prompt_id(
                                               std::string(300, 'y'));
                                         },
                                         "group 1 (prompt_id \"yyyy"},
                                    Case{"EmptyPrompt",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(1)->clear_prompt_tokens();
                                         },
                                         "group 1 (prompt_id \"p1\"): prompt has no tokens"},
                                    Case{"LongPrompt",
                                         [](v1::RolloutBatch* b, BatchLimits* l) {
                                           l->max_prompt_tokens = 1;
                                         },
                                         "group 0 (prompt_id \"p0\"): prompt has 2 tokens, more "
                                         "than max_prompt_tokens 1"},
                                    Case{"PromptTokenOutOfVocab",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(0)->set_prompt_tokens(1, 100);
                                         },
                                         "group 0 (prompt_id \"p0\"): prompt token 1 is 100, "
                                         "outside the vocabulary [0, 100)"},
                                    Case{"NegativeToken",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(1)->mutable_responses(2)->set_tokens(
                                               0, -1);
                                         },
                                         "group 1 (prompt_id \"p1\") response 2: response token 0 "
                                         "is -1"},
                                    Case{
                                        "GroupOfOne",
                                        [](v1::RolloutBatch* b, BatchLimits*) {
                                          b->mutable_groups(1)->mutable_responses()->DeleteSubrange(
                                              1, 2);
                                        },
                                        "group 1 (prompt_id \"p1\"): group has 1 responses; group "
                                        "size must be in [2, 4]"},
                                    Case{"GroupTooLarge",
                                         [](v1::RolloutBatch* b, BatchLimits* l) {
                                           l->max_group_size = 2;
                                         },
                                         "group 0 (prompt_id \"p0\"): group has 3 responses; group "
                                         "size must be in [2, 2]"},
                                    Case{"EmptyResponse",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(0)
                                               ->mutable_responses(1)
                                               ->clear_tokens();
                                         },
                                         "group 0 (prompt_id \"p0\") response 1: response has no "
                                         "tokens"},
                                    Case{"LongResponse",
                                         [](v1::RolloutBatch* b, BatchLimits* l) {
                                           l->max_response_tokens = 1;
                                         },
                                         "response 0: response has 2 tokens, more than "
                                         "max_response_tokens 1"},
                                    Case{"NanReward",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(1)->mutable_responses(0)->set_reward(
                                               NAN);
                                         },
                                         "group 1 (prompt_id \"p1\") response 0: reward is nan; "
                                         "rewards must be finite"},
                                    Case{"InfReward",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(0)->mutable_responses(2)->set_reward(
                                               -INFINITY);
                                         },
                                         "response 2: reward is -inf"},
                                    Case{"HugeReward",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(1)->mutable_responses(2)->set_reward(
                                               3e38f);
                                         },
                                         "group 1 (prompt_id \"p1\") response 2: reward is 3e+38, "
                                         "beyond max_abs_reward "
                                         "1e+06; rewards must lie within +-max_abs_reward"},
                                    Case{"RewardBeyondALowerBound",
                                         [](v1::RolloutBatch* b, BatchLimits* l) {
                                           l->max_abs_reward = 1;
                                           b->mutable_groups(0)->mutable_responses(0)->set_reward(
                                               -1.5f);
                                         },
                                         "response 0: reward is -1.5, beyond max_abs_reward 1"},
                                    Case{"MissingBehaviorLogProbs",
                                         [](v1::RolloutBatch* b, BatchLimits* l) {
                                           l->require_behavior_logprobs = true;
                                         },
                                         "group 0 (prompt_id \"p0\") response 0: behavior_logprobs "
                                         "missing"},
                                    Case{"BehaviorLogProbsWrongLength",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           b->mutable_groups(0)
                                               ->mutable_responses(1)
                                               ->add_behavior_logprobs(-0.5f);
                                         },
                                         "behavior_logprobs has 1 values for 2 tokens"},
                                    Case{"PositiveBehaviorLogProb",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           auto* r = b->mutable_groups(0)->mutable_responses(1);
                                           r->add_behavior_logprobs(-0.5f);
                                           r->add_behavior_logprobs(0.25f);
                                         },
                                         "behavior_logprobs[1] is 0.25; a log-probability must be "
                                         "finite and <= 0"},
                                    Case{
                                        "LossMaskWrongLength",
                                        [](v1::RolloutBatch* b, BatchLimits*) {
                                          b->mutable_groups(1)->mutable_responses(2)->add_loss_mask(
                                              true);
                                        },
                                        "group 1 (prompt_id \"p1\") response 2: loss_mask has 1 "
                                        "entries for 2 tokens; it "
                                        "needs one per token"},
                                    Case{"LossMaskWithNothingGenerated",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           auto* r = b->mutable_groups(0)->mutable_responses(1);
                                           r->add_loss_mask(false);
                                           r->add_loss_mask(false);
                                         },
                                         "response 1: loss_mask marks none of its 2 tokens as "
                                         "generated"},
                                    Case{"BehaviorLogProbsForInsertedTokens",
                                         [](v1::RolloutBatch* b, BatchLimits*) {
                                           auto* r = b->mutable_groups(0)->mutable_responses(0);
                                           r->add_loss_mask(true);
                                           r->add_loss_mask(false);
                                           r->add_behavior_logprobs(-0.5f);
                                           r->add_behavior_logprobs(-0.5f);
                                         },
                                         "response 0: behavior_logprobs has 2 values for 1 "
                                         "generated tokens (loss_mask true); "
                                         "one per generated token"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

TEST(BatchValidationTest, AcceptsAValidBatch) {
  EXPECT_OK(ValidateRolloutBatch(ValidBatch(), Limits()));
}

TEST(BatchValidationTest, RefusesALastPolicyVersionWithoutAFirst) {
  v1::RolloutBatch b = ValidBatch();
  b.mutable_groups(1)->mutable_responses(2)->set_last_policy_version(4);
  EXPECT_THAT(ValidateRolloutBatch(b, Limits()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "group 1 (prompt_id \"p1\") response 2: last_policy_version is 4 without "
                       "first_policy_version"));
}

TEST(BatchValidationTest, RefusesALastPolicyVersionBelowTheFirst) {
  v1::RolloutBatch b = ValidBatch();
  v1::Response* r = b.mutable_groups(0)->mutable_responses(1);
  r->set_first_policy_version(5);
  r->set_last_policy_version(3);
  EXPECT_THAT(ValidateRolloutBatch(b, Limits()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "group 0 (prompt_id \"p0\") response 1: last_policy_version 3 is below "
                       "first_policy_version 5"));
}

// Unset, first alone, equal, or last newer (an in-flight weight update):
// how they stand to the learner's version is the learner's to check.
TEST(BatchValidationTest, AcceptsPolicyVersionsInOrderOrUnset) {
  v1::RolloutBatch b = ValidBatch();
  b.mutable_groups(0)->mutable_responses(0)->set_first_policy_version(7);
  v1::Response* equal = b.mutable_groups(0)->mutable_responses(1);
  equal->set_first_policy_version(0);
  equal->set_last_policy_version(0);
  v1::Response* updated = b.mutable_groups(1)->mutable_responses(0);
  updated->set_first_policy_version(1000);
  updated->set_last_policy_version(1002);
  EXPECT_OK(ValidateRolloutBatch(b, Limits()));
}

TEST(BatchValidationTest, AcceptsBehaviorLogProbsWhenWellFormed) {
  v1::RolloutBatch b = ValidBatch();
  BatchLimits l = Limits();
  l.require_behavior_logprobs = true;
  for (auto& g : *b.mutable_groups()) {
    for (auto& r : *g.mutable_responses()) {
      r.add_behavior_logprobs(-1.0f);
      r.add_behavior_logprobs(0.0f);
    }
  }
  EXPECT_OK(ValidateRolloutBatch(b, l));
}

TEST(BatchValidationTest, AcceptsALossMaskWithBehaviorLogProbsForGeneratedTokensOnly) {
  v1::RolloutBatch b = ValidBatch();
  BatchLimits l = Limits();
  l.require_behavior_logprobs = true;
  for (auto& g : *b.mutable_groups()) {
    for (auto& r : *g.mutable_responses()) {
      r.add_loss_mask(false);  // the first token inserted by the environment
      r.add_loss_mask(true);
      r.add_behavior_logprobs(-1.0f);
    }
  }
  EXPECT_OK(ValidateRolloutBatch(b, l));
  const v1::Response& r = b.groups(0).responses(0);
  EXPECT_EQ(GeneratedTokens(r), 1);
  EXPECT_FALSE(IsGenerated(r, 0));
  EXPECT_TRUE(IsGenerated(r, 1));
  EXPECT_EQ(GeneratedTokens(b.groups(0).responses(0)), 1);
  v1::Response plain;
  plain.add_tokens(3);
  plain.add_tokens(4);
  EXPECT_EQ(GeneratedTokens(plain), 2);  // no mask: every token
  EXPECT_TRUE(IsGenerated(plain, 1));
}

TEST(BatchValidationTest, EscapesUntrustedPromptIdsInMessages) {
  v1::RolloutBatch b = ValidBatch();
  b.mutable_groups(0)->set_prompt_id("a\n\"b");
  b.mutable_groups(0)->mutable_responses(0)->set_reward(NAN);
  const absl::Status s = ValidateRolloutBatch(b, Limits());
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "prompt_id \"a\\n\\\"b\""));
}

TEST(BatchValidationTest, ChecksTheLimitsThemselves) {
  BatchLimits l = Limits();
  l.min_group_size = 1;
  EXPECT_THAT(ValidateBatchLimits(l),
              StatusIs(absl::StatusCode::kInvalidArgument, "min_group_size must be at least 2"));
  l = Limits();
  l.max_group_size = 1;
  EXPECT_THAT(ValidateBatchLimits(l), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "max_group_size 1 is below min_group_size 2"));
  l = Limits();
  l.vocab_size = 0;
  EXPECT_THAT(ValidateBatchLimits(l),
              StatusIs(absl::StatusCode::kInvalidArgument, "vocab_size must be positive"));
  for (const double bad : {0.0, -1.0, 1e39, static_cast<double>(NAN)}) {
    l = Limits();
    l.max_abs_reward = bad;
    EXPECT_THAT(ValidateBatchLimits(l), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 "max_abs_reward must be in (0, 3.4e+38]"))
        << bad;
  }
  EXPECT_OK(ValidateBatchLimits(Limits()));
}

TEST(BatchValidationTest, AcceptsRewardsAtTheBound) {
  v1::RolloutBatch b = ValidBatch();
  b.mutable_groups(0)->mutable_responses(0)->set_reward(1e6f);
  b.mutable_groups(0)->mutable_responses(1)->set_reward(-1e6f);
  EXPECT_OK(ValidateRolloutBatch(b, Limits()));
}

TEST(BatchValidationTest, CountsGroupsResponsesAndTokens) {
  const BatchCounts c = CountBatch(ValidBatch());
  EXPECT_EQ(c.groups, 2);
  EXPECT_EQ(c.responses, 6);
  EXPECT_EQ(c.prompt_tokens, 4);
  EXPECT_EQ(c.response_tokens, 12);
}

}  // namespace
}  // namespace asympo
