// Packed sequences and activation checkpointing change how a step is
// computed, not what: the loss, its diagnostics and the gradients equal
// those of padded micro-batches without checkpointing, for every objective.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <random>
#include <string>
#include <vector>

#include "learner_server/trainer/trainer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"

namespace asympo::learner {
namespace {

// Groups of random sizes whose response lengths have a long tail: most 1-6
// tokens, one in five 12-40 (as in RL: a few long answers, many short).
std::vector<QueuedGroup> RandomGroups(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::vector<QueuedGroup> out;
  for (int g = 0; g < n; ++g) {
    QueuedGroup q;
    q.group.set_prompt_id("p" + std::to_string(g));
    const int prompt = uniform(1, 8);
    for (int t = 0; t < prompt; ++t) q.group.add_prompt_tokens(uniform(1, 31));
    const int size = uniform(2, 5);
    for (int r = 0; r < size; ++r) {
      v1::Response* resp = q.group.add_responses();
      const int length = uniform(1, 5) == 1 ? uniform(12, 40) : uniform(1, 6);
      for (int t = 0; t < length; ++t) {
        resp->add_tokens(uniform(0, 31));
        resp->add_behavior_logprobs(-0.1f - 0.1f * static_cast<float>(uniform(0, 30)));
      }
      resp->set_reward(static_cast<float>(uniform(0, 4)) / 4.0f);
      q.tokens += prompt + length;
    }
    out.push_back(q);
  }
  return out;
}

struct Computed {
  StepResult result;
  std::vector<at::Tensor> gradients;
};

// The step's gradients on a fresh tiny model (seed 5).
Computed Gradients(Objective objective, const std::vector<QueuedGroup>& groups, bool packed,
                   int64_t checkpoint_every, int64_t micro_batch_tokens) {
  ModelOptions mo;
  mo.seed = 5;
  mo.checkpoint_every = checkpoint_every;
  auto model = PolicyModel::CreateRandom(ModelConfig::Tiny(32), mo).value();
  TrainerOptions o = Options(objective);
  o.pack_sequences = packed;
  o.micro_batch_tokens = micro_batch_tokens;
  auto trainer = Trainer::Create(o, model.get(), nullptr).value();
  Computed c;
  c.result = trainer->ComputeGradients(groups).value();
  for (const at::Tensor& p : model->parameters()) c.gradients.push_back(p.grad().clone());
  return c;
}

class PackedTrainingTest : public ::testing::TestWithParam<Objective> {};

TEST_P(PackedTrainingTest, PackedEqualsPaddedOnRandomGroupsOfRandomLengths) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<QueuedGroup> groups = RandomGroups(7, seed);
    // Budgets that cut the step into several micro-batches, differently.
    const Computed padded = Gradients(GetParam(), groups, false, 0, 160);
    const Computed packed = Gradients(GetParam(), groups, true, 0, 96);
    EXPECT_GT(packed.result.micro_batches, 1);
    EXPECT_NEAR(packed.result.diagnostics.loss, padded.result.diagnostics.loss,
                1e-5 * (1 + std::abs(padded.result.diagnostics.loss)));
    EXPECT_NEAR(packed.result.diagnostics.mean_nll, padded.result.diagnostics.mean_nll, 1e-5);
    EXPECT_NEAR(packed.result.diagnostics.s_pos, padded.result.diagnostics.s_pos, 1e-5);
    EXPECT_EQ(packed.result.diagnostics.tokens, padded.result.diagnostics.tokens);
    ASSERT_EQ(packed.gradients.size(), padded.gradients.size());
    for (size_t i = 0; i < packed.gradients.size(); ++i) {
      EXPECT_TRUE(at::allclose(packed.gradients[i], padded.gradients[i], 1e-4, 1e-6))
          << "parameter " << i << ": max difference "
          << (packed.gradients[i] - padded.gradients[i]).abs().max().item<double>();
    }
  }
}

TEST_P(PackedTrainingTest, CheckpointedGradientsEqualTheUncheckpointedBitwise) {
  const std::vector<QueuedGroup> groups = RandomGroups(6, 11);
  for (const bool packed : {false, true}) {
    const Computed plain = Gradients(GetParam(), groups, packed, 0, 128);
    for (const int64_t every : {1, 2}) {
      SCOPED_TRACE(std::string(packed ? "packed" : "padded") + ", every " + std::to_string(every));
      const Computed checkpointed = Gradients(GetParam(), groups, packed, every, 128);
      EXPECT_EQ(checkpointed.result.diagnostics.loss, plain.result.diagnostics.loss);
      for (size_t i = 0; i < plain.gradients.size(); ++i) {
        EXPECT_TRUE(at::equal(checkpointed.gradients[i], plain.gradients[i]))
            << "parameter " << i << ": max difference "
            << (checkpointed.gradients[i] - plain.gradients[i]).abs().max().item<double>();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryObjective, PackedTrainingTest,
                         ::testing::Values(Objective::kNaive, Objective::kSpo, Objective::kAsympo,
                                           Objective::kAsympoStable, Objective::kGrpo,
                                           Objective::kGpg),
                         [](const ::testing::TestParamInfo<Objective>& info) {
                           return std::string(ObjectiveName(info.param));
                         });

TEST(PackedTrainingTest, PackingComputesFewerPositionsOnLongTailedLengths) {
  const std::vector<QueuedGroup> groups = RandomGroups(8, 4);
  std::vector<const QueuedGroup*> all;
  for (const QueuedGroup& q : groups) all.push_back(&q);
  PaddedLayoutOptions o;
  o.vocab_size = 32;
  const MicroBatch padded = PaddedLayout(o).Build(all).value();
  const MicroBatch packed = PackedLayout(o).Build(all).value();
  EXPECT_EQ(packed.real_tokens, padded.real_tokens);
  EXPECT_EQ(packed.longest, padded.longest);  // rows as long as the longest sequence
  EXPECT_LT(packed.rows, padded.rows);
  // Every packed row but one is more than half full (first fit).
  EXPECT_LT(packed.padded_tokens(), 2 * packed.real_tokens + packed.longest);
  EXPECT_EQ(padded.key_mask.sum().item<int64_t>(), padded.real_tokens);
  EXPECT_EQ(packed.key_mask.sum().item<int64_t>(), packed.real_tokens);
}

TEST(ActivationCheckpointingFlagTest, ParsesItsThreeForms) {
  EXPECT_EQ(ParseActivationCheckpointing("none").value(), 0);
  EXPECT_EQ(ParseActivationCheckpointing("layers").value(), 1);
  EXPECT_EQ(ParseActivationCheckpointing("every_3").value(), 3);
  EXPECT_EQ(ActivationCheckpointingName(3), "every_3");
  EXPECT_EQ(ActivationCheckpointingName(1), "layers");
  EXPECT_EQ(ActivationCheckpointingName(0), "none");
  for (const char* bad : {"every_0", "every_", "every_x", "all", ""}) {
    EXPECT_THAT(ParseActivationCheckpointing(bad),
                ::asympo::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                            "expected none, layers or every_N"))
        << bad;
  }
}

}  // namespace
}  // namespace asympo::learner
