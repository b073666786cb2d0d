// A training step that fails leaves everything as it was: the weights, the
// optimizer's moments and step count, the version, and no gradient left
// behind; its status carries the reason; the next step trains normally.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <limits>

#include "learner_server/trainer.h"
#include "tests/learner_server/trainer_test_util.h"

namespace asympo::learner {
namespace {

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
    ASSERT_TRUE(trainer_->Step(FixedGroups(4)).ok());
    ASSERT_TRUE(trainer_->Step(FixedGroups(4)).ok());
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
  absl::StatusOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(StepSkipReason(step.status()), kSkipNonFiniteLoss);
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("loss is not finite"));
  ExpectUnchanged(before, *model_, *trainer_);
  EXPECT_EQ(publisher_.publishes(), publishes) << "a skipped step published weights";
  // The next step trains.
  absl::StatusOr<StepResult> next = trainer_->Step(FixedGroups(4));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version, before.version + 1);
}

TEST_F(TrainerFailuresTest, AnInjectedLibTorchExceptionIsSkippedAndChangesNothing) {
  TrainerOptions o = Options(Objective::kAsympo);
  o.micro_batch_tokens = 40;  // several micro-batches: the throw comes after one backward
  o.fault_exception_steps = {3};
  Start(o);
  const Snapshot before = Take(*model_, *trainer_);
  absl::StatusOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(StepSkipReason(step.status()), kSkipTorchError);
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("training step: injected fault (--fault_exception_steps)"));
  ExpectUnchanged(before, *model_, *trainer_);
  ASSERT_TRUE(trainer_->Step(FixedGroups(4)).ok());
  EXPECT_EQ(trainer_->version(), before.version + 1);
}

TEST_F(TrainerFailuresTest, BadDataIsAnInvalidBatchAndChangesNothing) {
  Start(Options(Objective::kAsympo));
  const Snapshot before = Take(*model_, *trainer_);
  std::vector<QueuedGroup> groups = FixedGroups(4);
  groups[2].group.mutable_responses(1)->set_tokens(0, 1000);  // outside the vocabulary
  absl::StatusOr<StepResult> step = trainer_->Step(std::move(groups));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(StepSkipReason(step.status()), kSkipInvalidBatch);
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("token 1000"));
  ExpectUnchanged(before, *model_, *trainer_);
  EXPECT_EQ(StepSkipReason(trainer_->Step({}).status()), kSkipInvalidBatch);
}

TEST_F(TrainerFailuresTest, NonFiniteLogProbsAreANonFiniteLossAndChangeNothing) {
  Start(Options(Objective::kNaive));
  {
    // An infinite output weight: the logits, then the log-probs, overflow.
    at::NoGradGuard no_grad;
    model_->lm_head_weight()[0][0].fill_(std::numeric_limits<float>::infinity());
  }
  const Snapshot before = Take(*model_, *trainer_);
  absl::StatusOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(StepSkipReason(step.status()), kSkipNonFiniteLoss) << step.status();
  ExpectUnchanged(before, *model_, *trainer_);
}

TEST_F(TrainerFailuresTest, ANonFiniteGradientIsSkippedAndChangesNothing) {
  Start(Options(Objective::kNaive));
  // The loss stays finite; one parameter's gradient becomes NaN.
  at::Tensor p = model_->parameters().back();
  p.register_hook([](at::Tensor g) { return g * std::numeric_limits<float>::quiet_NaN(); });
  const Snapshot before = Take(*model_, *trainer_);
  absl::StatusOr<StepResult> step = trainer_->Step(FixedGroups(4));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(StepSkipReason(step.status()), kSkipNonFiniteGradient) << step.status();
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("gradient is not finite"));
  ExpectUnchanged(before, *model_, *trainer_);
}

TEST(StepSkipReasonTest, StatusesWithoutAReasonAreErrors) {
  EXPECT_EQ(StepSkipReason(absl::InternalError("x")), "error");
}

}  // namespace
}  // namespace asympo::learner
