#include "learner_server/trainer/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "tests/testing/in_process_publisher.h"
#include "tests/testing/one_rank_collectives.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::InProcessPublisher;
using ::asympo::testing::StatusIs;

// The gradients of every parameter of `a` and `b` match: exactly, or to
// float32 rounding.
void ExpectSameGradients(PolicyModel& a, PolicyModel& b, bool exact) {
  for (size_t i = 0; i < a.named_parameters().size(); ++i) {
    const torch::Tensor ga = a.named_parameters()[i].second.grad();
    const torch::Tensor gb = b.named_parameters()[i].second.grad();
    ASSERT_TRUE(ga.defined() && gb.defined());
    EXPECT_TRUE(exact ? torch::equal(ga, gb) : torch::allclose(ga, gb, 1e-4, 1e-7))
        << a.named_parameters()[i].first;
  }
}

TEST(TrainerTest, ATrainingStepLowersTheLossOnAFixedBatch) {
  auto model = Tiny();
  auto trainer = Trainer::Create(Options(Objective::kNaive), model.get(), nullptr).value();
  const auto first = trainer->Step(FixedGroups(6)).value();
  double last = first.diagnostics.loss;
  for (int i = 0; i < 4; ++i) last = trainer->Step(FixedGroups(6)).value().diagnostics.loss;
  EXPECT_LT(last, first.diagnostics.loss);
  EXPECT_EQ(trainer->version(), 5u);
}

TEST(TrainerTest, AsympoRaisesRewardedAndLowersUnrewardedLogProbs) {
  auto model = Tiny();
  auto trainer = Trainer::Create(Options(Objective::kAsympo), model.get(), nullptr).value();
  const auto before = trainer->Step(FixedGroups(6)).value();
  StepResult after;
  for (int i = 0; i < 5; ++i) after = trainer->Step(FixedGroups(6)).value();
  // The forward loss is 0 every step, but the scales move: the rewarded
  // responses' NLL falls relative to the others'.
  EXPECT_NEAR(after.diagnostics.loss, 0.0, 1e-6);
  EXPECT_LT(after.diagnostics.s_pos, before.diagnostics.s_pos);
  EXPECT_GT(after.diagnostics.s_neg - after.diagnostics.s_pos,
            before.diagnostics.s_neg - before.diagnostics.s_pos);
}

TEST(TrainerTest, MicroBatchingGivesTheSameGradientsAsOneBatch) {
  auto a = Tiny(), b = Tiny();
  TrainerOptions small = Options(Objective::kAsympo), large = small;
  small.micro_batch_tokens = 20;  // one group per micro-batch
  large.micro_batch_tokens = 1 << 20;
  auto ta = Trainer::Create(small, a.get(), nullptr).value();
  auto tb = Trainer::Create(large, b.get(), nullptr).value();
  const auto ra = ta->ComputeGradients(FixedGroups(5)).value();
  const auto rb = tb->ComputeGradients(FixedGroups(5)).value();
  EXPECT_EQ(ra.micro_batches, 5);
  EXPECT_EQ(rb.micro_batches, 1);
  EXPECT_NEAR(ra.diagnostics.s_pos, rb.diagnostics.s_pos, 1e-5);
  EXPECT_NEAR(ra.diagnostics.imbalance, rb.diagnostics.imbalance, 1e-5);
  EXPECT_EQ(ra.diagnostics.tokens, rb.diagnostics.tokens);
  ExpectSameGradients(*a, *b, /*exact=*/false);
}

TEST(TrainerTest, PublishesEveryVersionAndMeasuresStaleness) {
  auto model = Tiny();
  InProcessPublisher publisher;
  auto trainer = Trainer::Create(Options(Objective::kSpo), model.get(), &publisher).value();
  ASSERT_OK(trainer->Step(FixedGroups(2)));
  ASSERT_OK(trainer->Step(FixedGroups(2)));
  const auto r = trainer->Step(FixedGroups(3, /*arrival=*/1)).value();
  EXPECT_EQ(publisher.version(), 3u);
  EXPECT_EQ(publisher.publishes(), 3);
  EXPECT_EQ(r.staleness, std::vector<uint64_t>({1, 1, 1}));  // arrived at v1, used at v2
  EXPECT_TRUE(torch::equal(publisher.weights()[0].second, model->named_parameters()[0].second));
}

TEST(TrainerTest, AVersionNotPublishedIsNotReadOnAnyRank) {
  auto model = Tiny();
  InProcessPublisher publisher;
  TrainerOptions o = Options(Objective::kSpo);
  o.publish_every = 3;
  auto trainer = Trainer::Create(o, model.get(), &publisher).value();
  ::asympo::testing::OneRankCollectives world;
  ASSERT_OK(trainer->ShardFully(&world));
  // Fully sharded, reading a version gathers its units: versions 1 and 2
  // are not published, so no rank gathers anything for them.
  ASSERT_OK(trainer->Step(FixedGroups(2)));
  ASSERT_OK(trainer->Step(FixedGroups(2)));
  EXPECT_EQ(world.gathers, 0);
  EXPECT_EQ(publisher.publishes(), 0);
  ASSERT_OK(trainer->Step(FixedGroups(2)));
  EXPECT_GT(world.gathers, 0);
  EXPECT_EQ(publisher.publishes(), 1);
  EXPECT_EQ(publisher.version(), 3u);
  trainer->set_publish_every(0);  // none
  const int before = world.gathers;
  for (int i = 0; i < 3; ++i) ASSERT_OK(trainer->Step(FixedGroups(2)));
  EXPECT_EQ(world.gathers, before);
  EXPECT_EQ(publisher.publishes(), 1);
}

TEST(TrainerTest, RunsTheGrpoBaselineWithBehaviorLogProbs) {
  auto model = Tiny();
  auto trainer = Trainer::Create(Options(Objective::kGrpo), model.get(), nullptr).value();
  const auto r = trainer->Step(FixedGroups(3));
  ASSERT_OK(r);
  EXPECT_GT(r->diagnostics.clip_high_fraction + r->diagnostics.clip_low_fraction, 0.0);
}

const Objective kEveryObjective[] = {Objective::kNaive,        Objective::kSpo,  Objective::kAsympo,
                                     Objective::kAsympoStable, Objective::kGrpo, Objective::kGpg};

// For every objective: the gradients of `a` and of `b`, which must be the
// same step, match (exactly, or to float32 rounding).
void ExpectTheSameStep(const std::vector<QueuedGroup>& a_groups,
                       const std::vector<QueuedGroup>& b_groups, bool exact) {
  for (const Objective objective : kEveryObjective) {
    SCOPED_TRACE(std::string(ObjectiveName(objective)));
    auto a = Tiny(), b = Tiny();
    auto ta = Trainer::Create(Options(objective), a.get(), nullptr).value();
    auto tb = Trainer::Create(Options(objective), b.get(), nullptr).value();
    const auto ra = ta->ComputeGradients(a_groups).value();
    const auto rb = tb->ComputeGradients(b_groups).value();
    EXPECT_NEAR(ra.diagnostics.loss, rb.diagnostics.loss, exact ? 0.0 : 1e-6);
    EXPECT_NEAR(ra.diagnostics.s_pos, rb.diagnostics.s_pos, exact ? 0.0 : 1e-6);
    EXPECT_NEAR(ra.diagnostics.s_neg, rb.diagnostics.s_neg, exact ? 0.0 : 1e-6);
    ExpectSameGradients(*a, *b, exact);
  }
}

// FixedGroups(5) with `tail` appended to every response as inserted tokens
// (loss mask false; the generated ones true).
std::vector<QueuedGroup> WithInsertedTail(const std::vector<int32_t>& tail) {
  std::vector<QueuedGroup> groups = FixedGroups(5);
  for (QueuedGroup& q : groups) {
    for (v1::Response& r : *q.group.mutable_responses()) {
      for (int t = 0; t < r.tokens_size(); ++t) r.add_loss_mask(true);
      for (int32_t token : tail) {
        r.add_tokens(token);
        r.add_loss_mask(false);  // its behavior log-probs stay one per generated token
      }
    }
  }
  return groups;
}

TEST(TrainerTest, ALossMaskOfGeneratedTokensOnlyChangesNothing) {
  std::vector<QueuedGroup> marked = FixedGroups(5);
  for (QueuedGroup& q : marked) {
    for (v1::Response& r : *q.group.mutable_responses()) {
      for (int t = 0; t < r.tokens_size(); ++t) r.add_loss_mask(true);
    }
  }
  ExpectTheSameStep(FixedGroups(5), marked, /*exact=*/true);
}

TEST(TrainerTest, AnInsertedTokenAddsNothingToTheLossOrItsGradients) {
  // Every response ends with a token the environment inserted: nothing
  // comes after it, so the step must be the step without it, whatever the
  // model predicts for it (to float32 rounding: the batch is one column
  // wider).
  ExpectTheSameStep(FixedGroups(5), WithInsertedTail({7}), /*exact=*/false);
}

TEST(TrainerTest, WhichTokensWereInsertedAtTheEndChangesNoGradientBitForBit) {
  // The same shapes, the inserted tail's tokens different: their own
  // log-probs take no part, so every gradient is bit for bit the same.
  ExpectTheSameStep(WithInsertedTail({7, 8}), WithInsertedTail({3, 11}), /*exact=*/true);
  // And the check can fail: the same tails trained on (mask true) differ.
  std::vector<QueuedGroup> a = WithInsertedTail({7, 8}), b = WithInsertedTail({3, 11});
  for (auto* groups : {&a, &b}) {
    for (QueuedGroup& q : *groups) {
      for (v1::Response& r : *q.group.mutable_responses()) {
        r.clear_loss_mask();
        r.clear_behavior_logprobs();
      }
    }
  }
  auto ma = Tiny(), mb = Tiny();
  auto ta = Trainer::Create(Options(Objective::kAsympo), ma.get(), nullptr).value();
  auto tb = Trainer::Create(Options(Objective::kAsympo), mb.get(), nullptr).value();
  ASSERT_OK(ta->ComputeGradients(a));
  ASSERT_OK(tb->ComputeGradients(b));
  bool differ = false;
  for (size_t i = 0; i < ma->named_parameters().size(); ++i) {
    differ |= !torch::equal(ma->named_parameters()[i].second.grad(),
                            mb->named_parameters()[i].second.grad());
  }
  EXPECT_TRUE(differ) << "trained on, the tails' tokens change the gradients";
}

// Low-rank adapters under every objective: the steps move the adapters
// (B away from zero, float32) and nothing else: the frozen base is bit for
// bit what it was.
TEST(TrainerTest, AdaptersTrainUnderEveryObjectiveAndTheBaseStaysFrozen) {
  for (const Objective objective : kEveryObjective) {
    SCOPED_TRACE(std::string(ObjectiveName(objective)));
    ModelOptions o;
    o.seed = 3;
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.targets = kAllLoraTargets;
    auto model = PolicyModel::CreateRandom(ModelConfig::Tiny(32), o).value();
    std::vector<torch::Tensor> base;
    for (const auto& [name, t] : model->named_weights()) base.push_back(t.clone());
    TrainerOptions options = Options(objective);
    options.lr.peak_lr = 3e-2;  // adapters want a larger lr
    auto trainer = Trainer::Create(options, model.get(), nullptr).value();
    for (int i = 0; i < 3; ++i) ASSERT_OK(trainer->Step(FixedGroups(4)));
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_TRUE(torch::equal(model->named_weights()[i].second, base[i]))
          << model->named_weights()[i].first;
    }
    bool moved = false;
    for (const auto& [name, t] : model->named_parameters()) {
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
      if (name.find("lora_B") != std::string::npos) moved |= t.abs().max().item<float>() > 0;
    }
    EXPECT_TRUE(moved) << "no adapter moved";
    EXPECT_EQ(trainer->version(), 3u);
  }
}

TEST(TrainerTest, RejectsBadOptionsByName) {
  auto model = Tiny();
  TrainerOptions o = Options(Objective::kAsympo);
  o.micro_batch_tokens = 0;
  EXPECT_THAT(Trainer::Create(o, model.get(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "micro_batch_tokens is 0"));
  o = Options(Objective::kAsympo);
  o.lr.kind = "linear";
  EXPECT_THAT(Trainer::Create(o, model.get(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--lr_schedule=linear: expected constant or cosine"));
  o = Options(Objective::kAsympo);
  o.publish_every = -1;
  EXPECT_THAT(Trainer::Create(o, model.get(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "publish_every is -1"));
}

TEST(LrScheduleTest, WarmsUpThenDecaysAlongACosine) {
  LrScheduleOptions o;
  o.peak_lr = 1.0;
  o.warmup_steps = 4;
  o.kind = "cosine";
  o.total_steps = 14;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(o, 0), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(o, 3), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 4), 1.0);
  EXPECT_NEAR(LearningRate(o, 9), 0.55, 1e-12);  // half way: 0.1 + 0.9 * 0.5
  EXPECT_NEAR(LearningRate(o, 14), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(o, 100), 0.1, 1e-12);
  o.kind = "constant";
  EXPECT_DOUBLE_EQ(LearningRate(o, 50), 1.0);
}

}  // namespace
}  // namespace asympo::learner
