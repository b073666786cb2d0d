// Bad inputs and bad options produce INVALID_ARGUMENT errors that name the
// problem; none crashes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "learner_server/loss/policy_loss.h"
#include "tests/learner_server/loss/loss_test_util.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::learner::testing::Batch;
using ::asympo::learner::testing::MakeLoss;
using ::asympo::learner::testing::RandomBatch;
using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

void ExpectInvalid(const absl::Status& status, const std::string& fragment) {
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, fragment));
}

absl::Status ComputeStatus(Objective objective, const LossInputs& in) {
  return MakeLoss(objective).Compute(in).status();
}

TEST(PolicyLossErrorsTest, GrpoWithoutBehaviorLogProbsIsAnError) {
  const Batch b = RandomBatch({3, 3}, 4, 1);
  ExpectInvalid(ComputeStatus(Objective::kGrpo, b.Inputs(/*with_behavior=*/false)),
                "grpo objective needs behavior_logprobs");
  // Every other objective ignores them.
  for (Objective o : {Objective::kNaive, Objective::kSpo, Objective::kAsympo,
                      Objective::kAsympoStable, Objective::kGpg}) {
    EXPECT_OK(MakeLoss(o).Compute(b.Inputs(false))) << ObjectiveName(o);
  }
}

TEST(PolicyLossErrorsTest, RejectsEmptyGroup) {
  const Batch b = RandomBatch({3, 3}, 4, 2);
  LossInputs in = b.Inputs();
  in.num_groups = 3;  // group 2 has no responses
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in), "group 2 is empty");
}

TEST(PolicyLossErrorsTest, RejectsGroupOfOne) {
  const Batch b = RandomBatch({3, 1, 2}, 4, 3);
  ExpectInvalid(ComputeStatus(Objective::kAsympo, b.Inputs()), "group 1 has 1 response");
}

TEST(PolicyLossErrorsTest, RejectsZeroLengthResponse) {
  const Batch b = RandomBatch({3, 3}, 4, 4);
  LossInputs in = b.Inputs();
  in.mask = b.mask.clone();
  in.mask[4].fill_(false);
  ExpectInvalid(ComputeStatus(Objective::kNaive, in), "response 4 has no tokens");
}

TEST(PolicyLossErrorsTest, RejectsNonFiniteReward) {
  const Batch b = RandomBatch({3, 3}, 4, 5);
  LossInputs in = b.Inputs();
  in.rewards = b.rewards.clone();
  in.rewards[2] = NAN;
  ExpectInvalid(ComputeStatus(Objective::kSpo, in), "reward of response 2 is nan");
  in.rewards[2] = INFINITY;
  ExpectInvalid(ComputeStatus(Objective::kSpo, in), "reward of response 2 is inf");
}

TEST(PolicyLossErrorsTest, RejectsNonFiniteLogProbOnARealToken) {
  const Batch b = RandomBatch({3, 3}, 4, 6);
  LossInputs in = b.Inputs();
  torch::Tensor logp = b.logp.detach().clone();
  logp[1][0] = -INFINITY;
  in.token_logprobs = logp;
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in),
                "token_logprobs of response 1 token 0 is -inf");
  torch::Tensor behavior = b.behavior.clone();
  behavior[5][0] = NAN;
  in = b.Inputs();
  in.behavior_logprobs = behavior;
  ExpectInvalid(ComputeStatus(Objective::kGrpo, in),
                "behavior_logprobs of response 5 token 0 is nan");
}

TEST(PolicyLossErrorsTest, RejectsMismatchedShapes) {
  const Batch b = RandomBatch({3, 3}, 4, 7);
  LossInputs in = b.Inputs();
  in.mask = b.mask.narrow(1, 0, 3);
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in),
                "token_logprobs has shape [6, 4] but mask has [6, 3]");
  in = b.Inputs();
  in.rewards = b.rewards.narrow(0, 0, 5);
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in),
                "rewards must be a 1-D tensor with one entry per response (6)");
  in = b.Inputs();
  in.group_index = b.group.narrow(0, 0, 4);
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in), "group_index must be a 1-D tensor");
  in = b.Inputs();
  in.behavior_logprobs = b.behavior.narrow(1, 0, 2);
  ExpectInvalid(ComputeStatus(Objective::kGrpo, in), "behavior_logprobs has shape [6, 2]");
  in = b.Inputs();
  in.token_logprobs = b.logp.detach().reshape({-1});
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in), "token_logprobs must be a floating (N, T)");
}

TEST(PolicyLossErrorsTest, RejectsGroupIndexOutOfRange) {
  const Batch b = RandomBatch({3, 3}, 4, 8);
  LossInputs in = b.Inputs();
  in.group_index = b.group.clone();
  in.group_index[0] = 7;
  ExpectInvalid(ComputeStatus(Objective::kAsympo, in), "group_index holds 7, outside [0, 2)");
}

TEST(PolicyLossErrorsTest, RejectsStepTotalsSmallerThanTheMicroBatch) {
  const Batch b = RandomBatch({3, 3}, 4, 9);
  LossInputs in = b.Inputs();
  in.step_totals = StepTotals{1, 6, 100, 0};
  ExpectInvalid(ComputeStatus(Objective::kGpg, in), "cannot contain this micro-batch");
}

TEST(PolicyLossErrorsTest, RejectsBadOptionsByName) {
  struct Case {
    void (*mutate)(PolicyLossOptions*);
    const char* fragment;
  };
  const Case cases[] = {
      {[](PolicyLossOptions* o) { o->spo_alpha = 1.5; }, "spo_alpha is 1.5"},
      {[](PolicyLossOptions* o) { o->spo_alpha = -0.1; }, "spo_alpha is -0.1"},
      {[](PolicyLossOptions* o) { o->p_low = 0; }, "p_low is 0"},
      {[](PolicyLossOptions* o) { o->p_high = 1e-4; }, "p_high is 0.0001"},
      {[](PolicyLossOptions* o) { o->scale_floor = 0; }, "scale_floor is 0"},
      {[](PolicyLossOptions* o) { o->clip_eps_low = 1.0; }, "clip_eps_low is 1"},
      {[](PolicyLossOptions* o) { o->clip_eps_high = NAN; }, "clip_eps_high is nan"},
      {[](PolicyLossOptions* o) {
         o->advantage.normalization = AdvantageNormalization::kMeanStd;
         o->advantage.std_epsilon = 0;
       },
       "std_epsilon is 0"},
  };
  for (const Case& c : cases) {
    PolicyLossOptions o;
    c.mutate(&o);
    ExpectInvalid(PolicyLoss::Create(o).status(), c.fragment);
  }
}

TEST(PolicyLossErrorsTest, ErrorsLeaveTheInputsUntouched) {
  const Batch b = RandomBatch({3, 1}, 4, 10);
  const torch::Tensor before = b.logp.detach().clone();
  ASSERT_THAT(MakeLoss(Objective::kAsympo).Compute(b.Inputs()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(torch::equal(before.nan_to_num(0), b.logp.detach().nan_to_num(0)));
  EXPECT_FALSE(b.logp.grad().defined());
}

}  // namespace
}  // namespace asympo::learner
