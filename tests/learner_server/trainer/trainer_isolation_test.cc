// A poisoned group (one whose loss or gradient is non-finite by itself)
// costs only itself: it is dropped from its step, and the step trains on
// the others exactly as if only they had been popped.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <limits>

#include "learner_server/trainer/trainer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;

// Rewards whose group sum overflows float32: finite each, but the
// advantages, then the loss, are not.
void Poison(QueuedGroup* q) {
  for (int r = 0; r < q->group.responses_size(); ++r) {
    q->group.mutable_responses(r)->set_reward(r == 0 ? -3e38f : 3e38f);
  }
}

std::vector<at::Tensor> Weights(const PolicyModel& model) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : model.named_parameters()) out.push_back(t.detach().clone());
  return out;
}

class TrainerIsolationTest : public ::testing::TestWithParam<Objective> {};

TEST_P(TrainerIsolationTest, APoisonedGroupIsDroppedAndTheOthersTrainAsIfAlone) {
  const TrainerOptions options = Options(GetParam());
  std::vector<QueuedGroup> poisoned = FixedGroups(4);
  Poison(&poisoned[2]);
  std::vector<QueuedGroup> honest = FixedGroups(4);
  honest.erase(honest.begin() + 2);

  // The premise: the poisoned group makes a step non-finite by itself (a
  // step of it alone is skipped, blaming it).
  auto probe_model = Tiny();
  auto probe = Trainer::Create(options, probe_model.get(), nullptr).value();
  const StepOr<StepResult> alone = probe->Step({poisoned[2]});
  ASSERT_THAT(alone, StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(alone.reason(), SkipReason::kPoisonedGroups) << alone.status();

  auto model_a = Tiny();
  auto a = Trainer::Create(options, model_a.get(), nullptr).value();
  StepOr<StepResult> step = a->Step(poisoned);
  ASSERT_OK(step);
  EXPECT_THAT(step->dropped, ElementsAre(2u));
  EXPECT_EQ(step->diagnostics.groups, 3);
  EXPECT_EQ(step->staleness.size(), 3u);
  EXPECT_EQ(step->version, 1u);

  auto model_b = Tiny();
  auto b = Trainer::Create(options, model_b.get(), nullptr).value();
  StepOr<StepResult> reference = b->Step(honest);
  ASSERT_OK(reference);
  EXPECT_TRUE(reference->dropped.empty());
  EXPECT_EQ(step->diagnostics.loss, reference->diagnostics.loss);
  EXPECT_EQ(step->grad_norm, reference->grad_norm);
  const std::vector<at::Tensor> wa = Weights(*model_a), wb = Weights(*model_b);
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_TRUE(torch::equal(wa[i], wb[i])) << "weight " << i << " differs from the honest step";
  }
  for (const at::Tensor& p : model_a->parameters()) {
    EXPECT_FALSE(p.grad().defined()) << "the step left a gradient behind";
  }
}

INSTANTIATE_TEST_SUITE_P(Objectives, TrainerIsolationTest,
                         ::testing::Values(Objective::kNaive, Objective::kAsympo, Objective::kSpo,
                                           Objective::kAsympoStable, Objective::kGrpo,
                                           Objective::kGpg),
                         [](const auto& info) { return std::string(ObjectiveName(info.param)); });

TEST(TrainerIsolationTest, AStepWhoseGroupsAreAllPoisonedIsSkipped) {
  auto model = Tiny();
  auto trainer = Trainer::Create(Options(Objective::kNaive), model.get(), nullptr).value();
  std::vector<QueuedGroup> groups = FixedGroups(3);
  for (QueuedGroup& q : groups) Poison(&q);
  const std::vector<at::Tensor> before = Weights(*model);
  StepOr<StepResult> step = trainer->Step(groups);
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(step.reason(), SkipReason::kPoisonedGroups) << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              ::testing::HasSubstr("each of the step's 3 groups made the loss or the gradient "
                                   "non-finite by its rewards"));
  EXPECT_EQ(trainer->version(), 0u);
  const std::vector<at::Tensor> after = Weights(*model);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after[i]));
}

// The sums of one rank: nothing to add.
class OneRankReducer : public StepReducer {
 public:
  absl::Status SumValues(std::vector<double>*) override { return absl::OkStatus(); }
  absl::Status SumGradients(const std::vector<at::Tensor>&) override { return absl::OkStatus(); }
};

TEST(TrainerIsolationTest, ADataParallelRankDropsItsPoisonedGroupsAndKeepsTheStepsTotals) {
  std::vector<QueuedGroup> shard = FixedGroups(3);
  shard[0].source = "gen-a";
  shard[1].source = "gen-b";
  const StepTotals totals = StepTotalsOf(shard);
  Poison(&shard[1]);
  std::vector<QueuedGroup> honest = {shard[0], shard[2]};
  OneRankReducer reducer;

  auto model_a = Tiny();
  auto a = Trainer::Create(Options(Objective::kAsympo), model_a.get(), nullptr).value();
  StepOr<StepResult> step = a->StepShard(shard, totals, &reducer);
  ASSERT_OK(step);
  EXPECT_THAT(step->dropped, ElementsAre(1u));
  EXPECT_THAT(step->dropped_sources, ElementsAre("gen-b"));
  // The same as a rank given the honest groups under the step's totals.
  auto model_b = Tiny();
  auto b = Trainer::Create(Options(Objective::kAsympo), model_b.get(), nullptr).value();
  ASSERT_OK(b->StepShard(honest, totals, &reducer));
  const std::vector<at::Tensor> wa = Weights(*model_a), wb = Weights(*model_b);
  for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(torch::equal(wa[i], wb[i])) << i;

  // A shard of poison only, on the only rank: the step is skipped.
  std::vector<QueuedGroup> poison = {shard[1], shard[1]};
  step = a->StepShard(poison, StepTotalsOf(poison), &reducer);
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(step.reason(), SkipReason::kPoisonedGroups) << step.status();
  EXPECT_EQ(a->version(), 1u);
}

TEST(TrainerIsolationTest, AStepOfOnePoisonedGroupBlamesItToo) {
  // A queue that holds one group at a time pops steps of one group: their
  // poison must be told from the model's fault as in larger steps.
  auto model = Tiny();
  auto trainer = Trainer::Create(Options(Objective::kNaive), model.get(), nullptr).value();
  std::vector<QueuedGroup> groups = FixedGroups(1);
  Poison(&groups[0]);
  const StepOr<StepResult> step = trainer->Step(groups);
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(step.reason(), SkipReason::kPoisonedGroups) << step.status();
  EXPECT_EQ(trainer->version(), 0u);
}

TEST(TrainerIsolationTest, AModelThatOverflowsBlamesNoGroup) {
  // Every group is non-finite alone, and still with tame rewards: the fault
  // is the weights', and the step is skipped as a non-finite loss.
  auto model = Tiny();
  auto trainer = Trainer::Create(Options(Objective::kNaive), model.get(), nullptr).value();
  {
    at::NoGradGuard no_grad;
    model->lm_head_weight()[0][0].fill_(std::numeric_limits<float>::infinity());
  }
  std::vector<QueuedGroup> groups = FixedGroups(3);
  Poison(&groups[1]);
  const StepOr<StepResult> step = trainer->Step(groups);
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(step.reason(), SkipReason::kNonFiniteLoss) << step.status();
  EXPECT_EQ(trainer->version(), 0u);
}

}  // namespace
}  // namespace asympo::learner
