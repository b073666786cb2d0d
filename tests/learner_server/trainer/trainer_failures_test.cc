// A training step that fails leaves everything as it was: the weights, the
// optimizer's moments and step count, the version, and no gradient left
// behind; its status carries the reason; the next step trains normally.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <limits>

#include "learner_server/trainer/trainer.h"
#include "tests/testing/in_process_publisher.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::InProcessPublisher;
using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// Everything a failed step must not change.
struct Snapshot {
  std::vector<at::Tensor> weights, moments;
  int64_t optimizer_steps = 0;
  uint64_t version = 0;
};

Snapshot Take(const PolicyModel& model, Trainer& trainer) {
  Snapshot s;
  for (const auto& [name, t] : model.named_parameters()) s.weights.push_back(t.detach().clone());
  for (const auto& [name, t] : trainer.optimizer().StateTensors()) s.moments.push_back(t.clone());
  s.optimizer_steps = trainer.optimizer().step_count();
  s.version = trainer.version();
  return s;
}

void ExpectUnchanged(const Snapshot& before, const PolicyModel& model, Trainer& trainer) {
  const Snapshot after = Take(model, trainer);
  ASSERT_EQ(after.weights.size(), before.weights.size());
  for (size_t i = 0; i < before.weights.size(); ++i) {
    EXPECT_TRUE(torch::equal(after.weights[i], before.weights[i])) << "weight " << i << " changed";
  }
  ASSERT_EQ(after.moments.size(), before.moments.size());
  for (size_t i = 0; i < before.moments.size(); ++i) {
    EXPECT_TRUE(torch::equal(after.moments[i], before.moments[i])) << "moment " << i << " changed";
  }
  EXPECT_EQ(after.optimizer_steps, before.optimizer_steps);
  EXPECT_EQ(after.version, before.version);
  for (const at::Tensor& p : model.parameters()) {
    EXPECT_FALSE(p.grad().defined()) << "a failed step left a gradient behind";
  }
}

class TrainerFailuresTest : public ::testing::Test {
 protected:
  // Trains two good steps first, so that the moments are not zero.
  void Start(TrainerOptions options) {
    model_ = Tiny();
    trainer_ = Trainer::Create(options, model_.get(), &publisher_).value();
    ASSERT_OK(trainer_->Step(FixedGroups(4)));
    ASSERT_OK(trainer_->Step(FixedGroups(4)));
  }

  std::unique_ptr<PolicyModel> model_;
  InProcessPublisher publisher_;
  std::unique_ptr<Trainer> trainer_;
};

TEST_F(TrainerFailuresTest, AnInjectedNonFiniteLossIsSkippedAndChangesNothing) {
  TrainerOptions o = Options(Objective::kAsympo);
  o.fault_nonfinite_loss_steps = {3};
  Start(o);
  const Snapshot before = Take(*model_, *trainer_);
  const int64_t publishes = publisher_.publishes();
  StepOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal, "loss is not finite"));
  EXPECT_EQ(step.reason(), SkipReason::kNonFiniteLoss);
  ExpectUnchanged(before, *model_, *trainer_);
  EXPECT_EQ(publisher_.publishes(), publishes) << "a skipped step published weights";
  // The next step trains.
  StepOr<StepResult> next = trainer_->Step(FixedGroups(4));
  ASSERT_OK(next);
  EXPECT_EQ(next->version, before.version + 1);
}

TEST_F(TrainerFailuresTest, AnInjectedLibTorchExceptionIsSkippedAndChangesNothing) {
  TrainerOptions o = Options(Objective::kAsympo);
  o.micro_batch_tokens = 40;  // several micro-batches: the throw comes after one backward
  o.fault_exception_steps = {3};
  Start(o);
  const Snapshot before = Take(*model_, *trainer_);
  StepOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(step.reason(), SkipReason::kTorchError);
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("training step: injected fault (--fault_exception_steps)"));
  ExpectUnchanged(before, *model_, *trainer_);
  ASSERT_OK(trainer_->Step(FixedGroups(4)));
  EXPECT_EQ(trainer_->version(), before.version + 1);
}

TEST_F(TrainerFailuresTest, BadDataIsAnInvalidBatchAndChangesNothing) {
  Start(Options(Objective::kAsympo));
  const Snapshot before = Take(*model_, *trainer_);
  std::vector<QueuedGroup> groups = FixedGroups(4);
  groups[2].group.mutable_responses(1)->set_tokens(0, 1000);  // outside the vocabulary
  StepOr<StepResult> step = trainer_->Step(std::move(groups));
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInvalidArgument, "token 1000"));
  EXPECT_EQ(step.reason(), SkipReason::kInvalidBatch);
  ExpectUnchanged(before, *model_, *trainer_);
  EXPECT_EQ(trainer_->Step({}).reason(), SkipReason::kInvalidBatch);
}

TEST_F(TrainerFailuresTest, NonFiniteLogProbsAreANonFiniteLossAndChangeNothing) {
  Start(Options(Objective::kNaive));
  {
    // An infinite output weight: the logits, then the log-probs, overflow.
    at::NoGradGuard no_grad;
    model_->lm_head_weight()[0][0].fill_(std::numeric_limits<float>::infinity());
  }
  const Snapshot before = Take(*model_, *trainer_);
  StepOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal, "not finite"));
  EXPECT_EQ(step.reason(), SkipReason::kNonFiniteLoss);
  ExpectUnchanged(before, *model_, *trainer_);
}

TEST_F(TrainerFailuresTest, ANonFiniteGradientIsSkippedAndChangesNothing) {
  Start(Options(Objective::kNaive));
  // The loss stays finite; one parameter's gradient becomes NaN.
  at::Tensor p = model_->parameters().back();
  p.register_hook([](at::Tensor g) { return g * std::numeric_limits<float>::quiet_NaN(); });
  const Snapshot before = Take(*model_, *trainer_);
  StepOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_THAT(step, StatusIs(absl::StatusCode::kInternal, "gradient is not finite"));
  EXPECT_EQ(step.reason(), SkipReason::kNonFiniteGradient);
  ExpectUnchanged(before, *model_, *trainer_);
}

TEST(SkipReasonTest, LabelsAreTheMetricsAndCodesGiveTheRest) {
  EXPECT_EQ(SkipReasonLabel(SkipReason::kNonFiniteLoss), "nonfinite_loss");
  EXPECT_EQ(SkipReasonLabel(SkipReason::kNonFiniteGradient), "nonfinite_gradient");
  EXPECT_EQ(SkipReasonLabel(SkipReason::kInvalidBatch), "invalid_batch");
  EXPECT_EQ(SkipReasonLabel(SkipReason::kOutOfMemory), "out_of_memory");
  EXPECT_EQ(SkipReasonLabel(SkipReason::kTorchError), "torch_error");
  EXPECT_EQ(SkipReasonLabel(SkipReason::kPoisonedGroups), "poisoned_groups");
  EXPECT_EQ(SkipReasonOfCode(absl::StatusCode::kResourceExhausted), SkipReason::kOutOfMemory);
  EXPECT_EQ(SkipReasonOfCode(absl::StatusCode::kInvalidArgument), SkipReason::kInvalidBatch);
  EXPECT_EQ(SkipReasonOfCode(absl::StatusCode::kInternal), SkipReason::kTorchError);
}

TEST(SkipReasonTest, AStepOrCarriesItsFailuresReason) {
  const StepOr<int> failed = StepFailure{absl::InternalError("x"), SkipReason::kPoisonedGroups};
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kInternal, "x"));
  EXPECT_EQ(failed.reason(), SkipReason::kPoisonedGroups);
  EXPECT_EQ(failed.failure().reason, SkipReason::kPoisonedGroups);
  const StepOr<int> plain = absl::ResourceExhaustedError("out of memory");
  EXPECT_EQ(plain.reason(), SkipReason::kOutOfMemory);
  const StepOr<int> value = 3;
  ASSERT_OK(value);
  EXPECT_EQ(*value, 3);
}

}  // namespace
}  // namespace asympo::learner
