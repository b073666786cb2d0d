// Tests of the policy objectives against the paper's identities, closed-form
// gradients and finite differences (docs/method.md).
#include "learner_server/loss/policy_loss.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "learner_server/loss/loss_diagnostics.h"
#include "learner_server/loss/token_logprobs.h"
#include "tests/learner_server/loss/loss_test_util.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::learner::testing::Batch;
using ::asympo::learner::testing::GradOf;
using ::asympo::learner::testing::MakeLoss;
using ::asympo::learner::testing::RandomBatch;
using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// Plain-loop reference quantities, independent of the library's tensor code.
struct Reference {
  std::vector<double> adv, scale;          // per response
  std::vector<double> mass, s_pos, s_neg;  // per group
};

Reference ComputeReference(const Batch& b) {
  Reference ref;
  const int64_t n = b.rewards.size(0);
  const auto r = b.rewards.accessor<double, 1>();
  const auto g = b.group.accessor<int64_t, 1>();
  const torch::Tensor lp = b.logp.detach();
  const auto l = lp.accessor<double, 2>();
  std::vector<double> sum(b.groups, 0.0), cnt(b.groups, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    sum[g[i]] += r[i];
    cnt[g[i]] += 1;
  }
  ref.mass.assign(b.groups, 0.0);
  std::vector<double> pos(b.groups, 0.0), neg(b.groups, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double a = r[i] - sum[g[i]] / cnt[g[i]];
    double s = 0;
    for (int64_t t = 0; t < b.lengths[i]; ++t) s -= l[i][t];
    s /= static_cast<double>(b.lengths[i]);
    ref.adv.push_back(a);
    ref.scale.push_back(s);
    if (a > 0) {
      ref.mass[g[i]] += a;
      pos[g[i]] += a * s;
    } else if (a < 0) {
      neg[g[i]] += -a * s;
    }
  }
  for (int64_t p = 0; p < b.groups; ++p) {
    ref.s_pos.push_back(ref.mass[p] > 0 ? pos[p] / ref.mass[p] : 0.0);
    ref.s_neg.push_back(ref.mass[p] > 0 ? neg[p] / ref.mass[p] : 0.0);
  }
  return ref;
}

double ItemOf(const torch::Tensor& t) { return t.item<double>(); }

TEST(PolicyLossTest, ParsesEveryObjectiveNameAndRejectsUnknown) {
  for (std::string_view name : ObjectiveNames()) {
    auto parsed = ParseObjective(name);
    ASSERT_OK(parsed) << name;
    EXPECT_EQ(ObjectiveName(*parsed), name);
  }
  auto bad = ParseObjective("ppo");
  ASSERT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, "unknown objective \"ppo\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("asympo_stable"));
}

TEST(PolicyLossTest, AsympoForwardLossIsExactlyZeroForZeroSumAdvantages) {
  // Rewards in quarters and power-of-two group sizes make every mean, weight
  // and advantage exact in binary, so (1/G) sum_g A_g is exactly 0.
  const Batch b = RandomBatch({4, 2, 8, 4}, 7, 1);
  const auto out = MakeLoss(Objective::kAsympo).Compute(b.Inputs()).value();
  EXPECT_EQ(ItemOf(out.loss), 0.0);
  // ... while the gradient is not zero.
  EXPECT_GT(ItemOf(GradOf(out.loss, b.logp).abs().sum()), 1e-3);
}

TEST(PolicyLossTest, AsympoForwardLossIsTheMeanAdvantageForAnyGroupSizes) {
  const Batch b = RandomBatch({4, 3, 5, 2}, 7, 1);
  const Reference ref = ComputeReference(b);
  const auto out = MakeLoss(Objective::kAsympo).Compute(b.Inputs()).value();
  double expect = 0;  // (1/P) sum_p (1/G_p) sum_g A_g, zero up to rounding
  const auto gi = b.group.accessor<int64_t, 1>();
  for (size_t i = 0; i < ref.adv.size(); ++i) {
    expect += ref.adv[i] / (4.0 * static_cast<double>(b.group_sizes[gi[i]]));
  }
  EXPECT_NEAR(ItemOf(out.loss), expect, 1e-16);
  EXPECT_NEAR(ItemOf(out.loss), 0.0, 1e-16);
}

TEST(PolicyLossTest, AsympoGradientIsAdvantageOverScaleTimesGradScale) {
  const Batch b = RandomBatch({4, 3, 6}, 9, 2);
  const Reference ref = ComputeReference(b);
  const auto out = MakeLoss(Objective::kAsympo).Compute(b.Inputs()).value();
  const torch::Tensor grad = GradOf(out.loss, b.logp);
  // L = (1/P) sum_p (1/G_p) sum_g A_g S_g / sg(S_g); dS_g/dl_gt = -1/m_g.
  const auto gr = grad.accessor<double, 2>();
  const auto gi = b.group.accessor<int64_t, 1>();
  for (int64_t i = 0; i < b.rewards.size(0); ++i) {
    const double w = 1.0 / (static_cast<double>(b.groups) * b.group_sizes[gi[i]]);
    const double expect = -w * ref.adv[i] / (ref.scale[i] * b.lengths[i]);
    for (int64_t t = 0; t < b.logp.size(1); ++t) {
      if (t < b.lengths[i]) {
        EXPECT_NEAR(gr[i][t], expect, 1e-14) << "response " << i << " token " << t;
      } else {
        EXPECT_EQ(gr[i][t], 0.0) << "padding must get no gradient";
      }
    }
  }
}

TEST(PolicyLossTest, AsympoGradientMatchesFiniteDifferencesThroughLogits) {
  // theta = logits; l = log_softmax(theta)[target]. The gradient must equal
  // that of F(theta) = (1/G) sum_g A_g S_g(theta) / c_g with c_g = S_g(theta0)
  // held fixed, which finite differences evaluate independently.
  torch::manual_seed(3);
  const int64_t n = 4, t = 3, v = 5;
  torch::Tensor logits = torch::randn({n, t, v}, torch::kDouble).requires_grad_(true);
  const torch::Tensor targets = torch::randint(0, v, {n, t}, torch::kLong);
  const torch::Tensor mask =
      torch::tensor({1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1}, torch::kBool).reshape({n, t});
  const torch::Tensor rewards = torch::tensor({1.0, 0.0, 0.5, 0.25}, torch::kDouble);
  const torch::Tensor group = torch::zeros({n}, torch::kLong);
  const PolicyLoss loss = MakeLoss(Objective::kAsympo);
  auto compute = [&](const torch::Tensor& theta) {
    LossInputs in;
    in.token_logprobs = TokenLogProbs(theta, targets, mask).value();
    in.mask = mask;
    in.rewards = rewards;
    in.group_index = group;
    in.num_groups = 1;
    return loss.Compute(in).value();
  };
  const LossOutput out = compute(logits);
  const torch::Tensor grad = GradOf(out.loss, logits);
  const torch::Tensor adv = out.diagnostics.advantages;
  const torch::Tensor c = out.diagnostics.response_scale;  // frozen S_g(theta0)
  auto surrogate = [&](const torch::Tensor& theta) {
    const torch::Tensor l = TokenLogProbs(theta, targets, mask).value();
    const torch::Tensor s = -l.sum(1) / mask.sum(1).to(torch::kDouble);
    return ItemOf((adv * s / c).mean());
  };
  const double h = 1e-6;
  torch::Tensor theta = logits.detach().clone();
  auto th = theta.accessor<double, 3>();
  const auto g = grad.accessor<double, 3>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < t; ++j) {
      for (int64_t k = 0; k < v; ++k) {
        const double keep = th[i][j][k];
        th[i][j][k] = keep + h;
        const double up = surrogate(theta);
        th[i][j][k] = keep - h;
        const double down = surrogate(theta);
        th[i][j][k] = keep;
        EXPECT_NEAR(g[i][j][k], (up - down) / (2 * h), 1e-8) << i << "," << j << "," << k;
      }
    }
  }
}

TEST(PolicyLossTest, NaiveMinusAsympoEqualsPositiveMassTimesScaleGap) {
  const Batch b = RandomBatch({5, 4, 3, 6}, 8, 4);
  const Reference ref = ComputeReference(b);
  const auto naive = MakeLoss(Objective::kNaive).Compute(b.Inputs()).value();
  const auto asympo = MakeLoss(Objective::kAsympo).Compute(b.Inputs()).value();
  // Batch form of the identity: mean over prompts of (B_p/G_p)(S_P - S_N).
  double expect = 0;
  for (int64_t p = 0; p < b.groups; ++p) {
    expect += ref.mass[p] / b.group_sizes[p] * (ref.s_pos[p] - ref.s_neg[p]);
  }
  expect /= static_cast<double>(b.groups);
  EXPECT_NEAR(ItemOf(naive.loss) - ItemOf(asympo.loss), expect, 1e-12);
  // The diagnostics report the same per-group quantities.
  for (int64_t p = 0; p < b.groups; ++p) {
    EXPECT_NEAR(ItemOf(naive.diagnostics.group_positive_mass[p]), ref.mass[p], 1e-12);
    EXPECT_NEAR(ItemOf(naive.diagnostics.group_s_pos[p]), ref.s_pos[p], 1e-12);
    EXPECT_NEAR(ItemOf(naive.diagnostics.group_s_neg[p]), ref.s_neg[p], 1e-12);
  }
}

TEST(PolicyLossTest, NaiveMinusAsympoIdentityHoldsForOneGroup) {
  const Batch b = RandomBatch({8}, 6, 5);
  const Reference ref = ComputeReference(b);
  const double naive = MakeLoss(Objective::kNaive).Compute(b.Inputs()).value().diagnostics.loss;
  const double asympo = MakeLoss(Objective::kAsympo).Compute(b.Inputs()).value().diagnostics.loss;
  EXPECT_NEAR(naive - asympo, ref.mass[0] / 8.0 * (ref.s_pos[0] - ref.s_neg[0]), 1e-12);
}

TEST(PolicyLossTest, SpoWithAlphaOneEqualsNaive) {
  const Batch b = RandomBatch({4, 4, 3}, 6, 6);
  PolicyLossOptions o;
  o.spo_alpha = 1.0;
  const auto spo = MakeLoss(Objective::kSpo, o).Compute(b.Inputs()).value();
  const auto naive = MakeLoss(Objective::kNaive).Compute(b.Inputs()).value();
  EXPECT_EQ(ItemOf(spo.loss), ItemOf(naive.loss));
  EXPECT_TRUE(torch::equal(GradOf(spo.loss, b.logp), GradOf(naive.loss, b.logp)));
}

TEST(PolicyLossTest, SpoWithAlphaZeroDropsNegativeResponses) {
  const Batch b = RandomBatch({5, 4, 6}, 6, 7);
  const Reference ref = ComputeReference(b);
  PolicyLossOptions o;
  o.spo_alpha = 0.0;
  const torch::Tensor spo =
      GradOf(MakeLoss(Objective::kSpo, o).Compute(b.Inputs()).value().loss, b.logp);
  const torch::Tensor naive =
      GradOf(MakeLoss(Objective::kNaive).Compute(b.Inputs()).value().loss, b.logp);
  int negatives = 0, positives = 0;
  for (int64_t i = 0; i < b.rewards.size(0); ++i) {
    if (ref.adv[i] < 0) {
      ++negatives;
      EXPECT_EQ(ItemOf(spo[i].abs().sum()), 0.0) << "negative response " << i;
    } else {
      positives += ref.adv[i] > 0;
      EXPECT_TRUE(torch::equal(spo[i], naive[i])) << "response " << i;
    }
  }
  EXPECT_GT(negatives, 0);
  EXPECT_GT(positives, 0);
}

TEST(PolicyLossTest, AsympoStableZeroesGradientPastBoundButKeepsTokenInScale) {
  PolicyLossOptions o;
  o.p_high = 0.9;
  o.p_low = 0.01;
  const PolicyLoss loss = MakeLoss(Objective::kAsympoStable, o);
  // One group of two: A = +0.5 (tokens 0.95*, 0.5, 0.3) and -0.5 (0.001*, 0.2),
  // * past their bound.
  torch::Tensor logp =
      torch::log(torch::tensor({{0.95, 0.5, 0.3}, {0.001, 0.2, 1.0}}, torch::kDouble))
          .requires_grad_(true);
  LossInputs in;
  in.token_logprobs = logp;
  in.mask = torch::tensor({{1, 1, 1}, {1, 1, 0}}, torch::kBool);
  in.rewards = torch::tensor({1.0, 0.0}, torch::kDouble);
  in.group_index = torch::zeros({2}, torch::kLong);
  in.num_groups = 1;
  const auto out = loss.Compute(in).value();
  const torch::Tensor grad = GradOf(out.loss, logp);
  EXPECT_EQ(ItemOf(grad[0][0]), 0.0);
  EXPECT_EQ(ItemOf(grad[1][0]), 0.0);
  // The clipped values log(0.9) and log(0.01) stay in the scales.
  const double s0 = -(std::log(0.9) + std::log(0.5) + std::log(0.3)) / 3;
  const double s1 = -(std::log(0.01) + std::log(0.2)) / 2;
  const double w = 0.5;  // 1 / G
  EXPECT_NEAR(ItemOf(grad[0][1]), -w * 0.5 / (s0 * 3), 1e-14);
  EXPECT_NEAR(ItemOf(grad[0][2]), -w * 0.5 / (s0 * 3), 1e-14);
  EXPECT_NEAR(ItemOf(grad[1][1]), -w * -0.5 / (s1 * 2), 1e-14);
  EXPECT_EQ(ItemOf(grad[1][2]), 0.0);
  // Forward value is still (1/G) sum A = 0, and one token in five sits at
  // each bound.
  EXPECT_EQ(out.diagnostics.loss, 0.0);
  EXPECT_DOUBLE_EQ(out.diagnostics.clip_high_fraction, 0.2);
  EXPECT_DOUBLE_EQ(out.diagnostics.clip_low_fraction, 0.2);
}

TEST(PolicyLossTest, AsympoStableFloorsTheScale) {
  PolicyLossOptions o;
  o.scale_floor = 0.5;
  // Response 0 has scale 0.1 (< floor), response 1 scale 1.2 (> floor).
  torch::Tensor logp =
      torch::tensor({{-0.1, -0.1}, {-1.2, -1.2}}, torch::kDouble).requires_grad_(true);
  LossInputs in;
  in.token_logprobs = logp;
  in.mask = torch::ones({2, 2}, torch::kBool);
  in.rewards = torch::tensor({0.0, 1.0}, torch::kDouble);
  in.group_index = torch::zeros({2}, torch::kLong);
  in.num_groups = 1;
  const auto out = MakeLoss(Objective::kAsympoStable, o).Compute(in).value();
  const torch::Tensor grad = GradOf(out.loss, logp);
  EXPECT_NEAR(ItemOf(grad[0][0]), -0.5 * -0.5 / (0.5 * 2), 1e-14);
  EXPECT_NEAR(ItemOf(grad[1][0]), -0.5 * 0.5 / (1.2 * 2), 1e-14);
}

TEST(PolicyLossTest, GrpoWithRatioOneHasThePlainPolicyGradient) {
  Batch b = RandomBatch({4, 5}, 7, 8);
  b.behavior = b.logp.detach().clone();
  const auto grpo = MakeLoss(Objective::kGrpo).Compute(b.Inputs()).value();
  const auto naive = MakeLoss(Objective::kNaive).Compute(b.Inputs()).value();
  EXPECT_TRUE(torch::allclose(GradOf(grpo.loss, b.logp), GradOf(naive.loss, b.logp), 0, 1e-15));
  EXPECT_NEAR(grpo.diagnostics.loss, 0.0, 1e-15);  // -(1/G) sum A
  EXPECT_EQ(grpo.diagnostics.clip_low_fraction, 0.0);
  EXPECT_EQ(grpo.diagnostics.clip_high_fraction, 0.0);
}

// One group of two responses, rewards 1 and 0 (A = +0.5, -0.5), three
// tokens each with log-prob 0 (`logp`) and behavior log-probs that make
// the token ratios `ratios`.
LossInputs GrpoPair(const torch::Tensor& logp, std::vector<std::vector<double>> ratios) {
  LossInputs in;
  in.token_logprobs = logp;
  in.mask = torch::ones({2, 3}, torch::kBool);
  in.rewards = torch::tensor({1.0, 0.0}, torch::kDouble);
  in.group_index = torch::zeros({2}, torch::kLong);
  in.num_groups = 1;
  torch::Tensor r = torch::empty({2, 3}, torch::kDouble);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t t = 0; t < 3; ++t) r[i][t] = ratios[i][t];
  }
  in.behavior_logprobs = -torch::log(r);  // rho = exp(0 - lb) = ratios
  return in;
}

TEST(PolicyLossTest, GrpoClipsRatiosBeyondEpsilonOnTheAdvantageSide) {
  // A = +0.5 for response 0, -0.5 for response 1; eps = 0.2.
  torch::Tensor logp = torch::zeros({2, 3}, torch::kDouble).requires_grad_(true);
  const LossInputs in = GrpoPair(logp, {{1.5, 1.1, 0.5}, {0.5, 0.9, 1.5}});
  const auto out = MakeLoss(Objective::kGrpo).Compute(in).value();
  const torch::Tensor grad = GradOf(out.loss, logp);
  const double w = 0.5 / 3;  // (1/G) * (1/m)
  // A > 0: clipped above 1.2 only; below 0.8 the unclipped term is the min.
  EXPECT_EQ(ItemOf(grad[0][0]), 0.0);
  EXPECT_NEAR(ItemOf(grad[0][1]), -w * 0.5 * 1.1, 1e-15);
  EXPECT_NEAR(ItemOf(grad[0][2]), -w * 0.5 * 0.5, 1e-15);
  // A < 0: clipped below 0.8 only.
  EXPECT_EQ(ItemOf(grad[1][0]), 0.0);
  EXPECT_NEAR(ItemOf(grad[1][1]), w * 0.5 * 0.9, 1e-15);
  EXPECT_NEAR(ItemOf(grad[1][2]), w * 0.5 * 1.5, 1e-15);
  EXPECT_NEAR(out.diagnostics.clip_high_fraction, 1.0 / 6, 1e-15);
  EXPECT_NEAR(out.diagnostics.clip_low_fraction, 1.0 / 6, 1e-15);
}

// VeRL's dual clip (clip_ratio_c = 3): with A < 0 a token's loss is at
// most -c A, so a ratio far above 1 + eps no longer grows it, and passes no
// gradient; below c, and with A > 0, the PPO clip as before.
TEST(PolicyLossTest, GrpoDualClipBoundsTheLossOfNegativeAdvantagesAtC) {
  torch::Tensor logp = torch::zeros({2, 3}, torch::kDouble).requires_grad_(true);
  const LossInputs in = GrpoPair(logp, {{5.0, 1.1, 0.5}, {5.0, 2.0, 1.5}});
  PolicyLossOptions o;
  o.clip_ratio_c = 3.0;
  const auto dual = MakeLoss(Objective::kGrpo, o).Compute(in).value();
  const auto plain = MakeLoss(Objective::kGrpo).Compute(in).value();
  const torch::Tensor grad = GradOf(dual.loss, logp), plain_grad = GradOf(plain.loss, logp);
  const double w = 0.5 / 3;
  // A < 0, ratio 5 > c: the loss is -c A = 1.5 there, with no gradient.
  EXPECT_EQ(ItemOf(grad[1][0]), 0.0);
  EXPECT_NEAR(ItemOf(plain_grad[1][0]), w * 0.5 * 5.0, 1e-15) << "unbounded without it";
  // A < 0, ratio 2 and 1.5 (below c): as plain PPO.
  EXPECT_NEAR(ItemOf(grad[1][1]), w * 0.5 * 2.0, 1e-15);
  EXPECT_NEAR(ItemOf(grad[1][2]), w * 0.5 * 1.5, 1e-15);
  // A > 0: untouched (ratio 5 clipped at 1 + eps as before).
  for (int t = 0; t < 3; ++t) EXPECT_EQ(ItemOf(grad[0][t]), ItemOf(plain_grad[0][t])) << t;
  // Loss: response 1's tokens give 0.5*(3) [bounded], 0.5*2, 0.5*1.5.
  const double response1 = (1.5 + 1.0 + 0.75) / 3, plain1 = (2.5 + 1.0 + 0.75) / 3;
  EXPECT_NEAR(dual.diagnostics.loss - plain.diagnostics.loss, 0.5 * (response1 - plain1), 1e-12);
  o.clip_ratio_c = 1.0;
  EXPECT_THAT(PolicyLoss::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "clip_ratio_c"));
}

LossInputs GpgExample(const torch::Tensor& logp) {
  // Group 0: rewards 1, 0, 0 (A = 2/3, -1/3, -1/3); group 1: rewards 1, 1
  // (all equal: no signal). Token log-probs, padding as 0:
  //   r0: -1 -2 | r1: -0.5 | r2: -1 -1 -1 | r3: -2 | r4: -3
  LossInputs in;
  in.token_logprobs = logp;
  in.mask = torch::tensor({{1, 1, 0}, {1, 0, 0}, {1, 1, 1}, {1, 0, 0}, {1, 0, 0}}, torch::kBool);
  in.rewards = torch::tensor({1.0, 0.0, 0.0, 1.0, 1.0}, torch::kDouble);
  in.group_index = torch::tensor({0, 0, 0, 1, 1}, torch::kLong);
  in.num_groups = 2;
  return in;
}

TEST(PolicyLossTest, GpgMatchesHandComputedValues) {
  torch::Tensor logp = torch::tensor({{-1.0, -2.0, 0.0},
                                      {-0.5, 0.0, 0.0},
                                      {-1.0, -1.0, -1.0},
                                      {-2.0, 0.0, 0.0},
                                      {-3.0, 0.0, 0.0}},
                                     torch::kDouble)
                           .requires_grad_(true);
  // sum A*l = (2/3)(-3) + (-1/3)(-0.5) + (-1/3)(-3) = -5/6 over 8 tokens;
  // alpha = B/(B-M) = 5/3. Loss = -alpha * (-5/6) / 8 = 25/144.
  const auto out = MakeLoss(Objective::kGpg).Compute(GpgExample(logp)).value();
  EXPECT_NEAR(out.diagnostics.loss, 25.0 / 144.0, 1e-15);
  EXPECT_NEAR(out.diagnostics.gpg_alpha, 5.0 / 3.0, 1e-15);
  EXPECT_DOUBLE_EQ(out.diagnostics.degenerate_group_fraction, 0.5);
  const torch::Tensor grad = GradOf(out.loss, logp);
  // d/dl = -alpha * A / 8.
  EXPECT_NEAR(ItemOf(grad[0][0]), -5.0 / 36.0, 1e-15);
  EXPECT_NEAR(ItemOf(grad[0][1]), -5.0 / 36.0, 1e-15);
  EXPECT_NEAR(ItemOf(grad[1][0]), 5.0 / 72.0, 1e-15);
  EXPECT_NEAR(ItemOf(grad[2][2]), 5.0 / 72.0, 1e-15);
  EXPECT_EQ(ItemOf(grad[3][0]), 0.0);
  EXPECT_EQ(ItemOf(grad[0][2]), 0.0);  // padding

  PolicyLossOptions no_correction;
  no_correction.gpg_gradient_correction = false;
  const auto plain = MakeLoss(Objective::kGpg, no_correction).Compute(GpgExample(logp)).value();
  EXPECT_NEAR(plain.diagnostics.loss, 5.0 / 48.0, 1e-15);
  EXPECT_EQ(plain.diagnostics.gpg_alpha, 1.0);
}

class EveryObjectiveTest : public ::testing::TestWithParam<Objective> {};

TEST_P(EveryObjectiveTest, PaddingNeverChangesTheResult) {
  const Batch b = RandomBatch({3, 4, 2}, 6, 9);
  const PolicyLoss loss = MakeLoss(GetParam());
  const auto base = loss.Compute(b.Inputs()).value();
  const torch::Tensor base_grad = GradOf(base.loss, b.logp);
  // Append 5 padding columns holding garbage (NaN, +inf, positive values).
  const int64_t n = b.rewards.size(0), extra = 5;
  Batch padded = b;
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const torch::Tensor junk =
      torch::tensor({nan, inf, 3.0, -7.0, nan}, torch::kDouble).repeat({n, 1});
  padded.logp = torch::cat({b.logp.detach(), junk}, 1).requires_grad_(true);
  padded.behavior = torch::cat({b.behavior, junk.flip(1)}, 1);
  padded.mask = torch::cat({b.mask, torch::zeros({n, extra}, torch::kBool)}, 1);
  const auto out = loss.Compute(padded.Inputs()).value();
  const torch::Tensor grad = GradOf(out.loss, padded.logp);
  EXPECT_NEAR(out.diagnostics.loss, base.diagnostics.loss, 1e-14);
  EXPECT_TRUE(torch::allclose(grad.narrow(1, 0, b.logp.size(1)), base_grad, 0, 1e-14));
  EXPECT_EQ(ItemOf(grad.narrow(1, b.logp.size(1), extra).abs().sum()), 0.0);
  EXPECT_NEAR(out.diagnostics.s_pos, base.diagnostics.s_pos, 1e-14);
  EXPECT_NEAR(out.diagnostics.mean_nll, base.diagnostics.mean_nll, 1e-14);
}

// The step totals of batch `b`, whose whole-batch diagnostics are `whole`.
StepTotals TotalsOf(const Batch& b, const LossDiagnostics& whole) {
  StepTotals totals;
  totals.groups = whole.groups;
  totals.responses = whole.responses;
  totals.tokens = whole.tokens;
  totals.degenerate_responses = 0;
  for (int64_t p = 0; p < b.groups; ++p) {
    if (ItemOf(whole.group_positive_mass[p]) == 0) totals.degenerate_responses += b.group_sizes[p];
  }
  return totals;
}

// Responses [start, start + len) of `b`, groups from `first_group` on (two
// of them), as one micro-batch of the step `totals`; `part` gets the
// micro-batch's own leaf of log-probs.
LossInputs MicroBatchOf(const Batch& b, int64_t start, int64_t len, int64_t first_group,
                        const StepTotals& totals, torch::Tensor* part) {
  LossInputs in;
  *part = b.logp.detach().narrow(0, start, len).clone().requires_grad_(true);
  in.token_logprobs = *part;
  in.mask = b.mask.narrow(0, start, len);
  in.rewards = b.rewards.narrow(0, start, len);
  in.group_index = b.group.narrow(0, start, len) - first_group;
  in.num_groups = 2;
  in.behavior_logprobs = b.behavior.narrow(0, start, len);
  in.step_totals = totals;
  return in;
}

// Split: groups {0, 1} = responses [0, 7) and groups {2, 3} = [7, 14).
constexpr std::tuple<int64_t, int64_t, int64_t> kTwoMicroBatches[] = {{0, 7, 0}, {7, 7, 2}};

TEST_P(EveryObjectiveTest, MicroBatchesWithStepTotalsSumToTheWholeStep) {
  const Batch b = RandomBatch({3, 4, 2, 5}, 6, 10);
  const PolicyLoss loss = MakeLoss(GetParam());
  const auto whole = loss.Compute(b.Inputs()).value();
  const torch::Tensor whole_grad = GradOf(whole.loss, b.logp);
  const StepTotals totals = TotalsOf(b, whole.diagnostics);
  double sum = 0;
  torch::Tensor grad = torch::zeros_like(whole_grad);
  for (auto [start, len, first_group] : kTwoMicroBatches) {
    torch::Tensor part;
    const auto out = loss.Compute(MicroBatchOf(b, start, len, first_group, totals, &part)).value();
    sum += out.diagnostics.loss;
    grad.narrow(0, start, len).copy_(GradOf(out.loss, part));
  }
  EXPECT_NEAR(sum, whole.diagnostics.loss, 1e-14);
  EXPECT_TRUE(torch::allclose(grad, whole_grad, 0, 1e-15));
}

// A short step (4 groups of a nominal 8) weighs each group as a step of 8
// does: loss and gradient at half of the whole-step ones; a step of at
// least step_groups is unchanged.
TEST_P(EveryObjectiveTest, AShortStepWeighsEachGroupAsAFullStepDoes) {
  const Batch b = RandomBatch({3, 4, 2, 5}, 6, 10);
  const PolicyLoss loss = MakeLoss(GetParam());
  const auto whole = loss.Compute(b.Inputs()).value();
  const torch::Tensor whole_grad = GradOf(whole.loss, b.logp);
  for (const int64_t step_groups : {8, 4, 2}) {
    StepTotals totals = TotalsOf(b, whole.diagnostics);
    totals.step_groups = step_groups;
    LossInputs in = b.Inputs();
    torch::Tensor logp = b.logp.detach().clone().requires_grad_(true);
    in.token_logprobs = logp;
    in.step_totals = totals;
    const auto out = loss.Compute(in).value();
    const double f = step_groups > 4 ? 4.0 / static_cast<double>(step_groups) : 1.0;
    EXPECT_NEAR(out.diagnostics.loss, f * whole.diagnostics.loss, 1e-14) << step_groups;
    EXPECT_TRUE(torch::allclose(GradOf(out.loss, logp), f * whole_grad, 0, 1e-15)) << step_groups;
  }
}

// What the trainer reports for a step of several micro-batches.
TEST_P(EveryObjectiveTest, DiagnosticSumsPoolMicroBatchesIntoTheWholeStepsDiagnostics) {
  const Batch b = RandomBatch({3, 4, 2, 5}, 6, 12);
  const PolicyLoss loss = MakeLoss(GetParam());
  const LossDiagnostics whole = loss.Compute(b.Inputs()).value().diagnostics;
  const StepTotals totals = TotalsOf(b, whole);
  DiagnosticSums sums;
  for (auto [start, len, first_group] : kTwoMicroBatches) {
    torch::Tensor part;
    sums.Add(
        loss.Compute(MicroBatchOf(b, start, len, first_group, totals, &part)).value().diagnostics);
  }
  const LossDiagnostics d = sums.Pooled();
  EXPECT_NEAR(d.loss, whole.loss, 1e-14);
  EXPECT_NEAR(d.s_pos, whole.s_pos, 1e-12);
  EXPECT_NEAR(d.s_neg, whole.s_neg, 1e-12);
  EXPECT_NEAR(d.naive_ratio, whole.naive_ratio, 1e-12);
  EXPECT_NEAR(d.imbalance, whole.imbalance, 1e-12);
  EXPECT_NEAR(d.clip_low_fraction, whole.clip_low_fraction, 1e-12);
  EXPECT_NEAR(d.clip_high_fraction, whole.clip_high_fraction, 1e-12);
  EXPECT_NEAR(d.mean_response_length, whole.mean_response_length, 1e-12);
  EXPECT_NEAR(d.mean_nll, whole.mean_nll, 1e-12);
  EXPECT_NEAR(d.reward_mean, whole.reward_mean, 1e-12);
  EXPECT_NEAR(d.reward_std, whole.reward_std, 1e-6);
  EXPECT_NEAR(d.degenerate_group_fraction, whole.degenerate_group_fraction, 1e-12);
  EXPECT_DOUBLE_EQ(d.gpg_alpha, whole.gpg_alpha);
  EXPECT_EQ(d.groups, whole.groups);
  EXPECT_EQ(d.responses, whole.responses);
  EXPECT_EQ(d.tokens, whole.tokens);
}

TEST_P(EveryObjectiveTest, ReportsDiagnosticsFromTheSameTensors) {
  const Batch b = RandomBatch({4, 4, 3}, 5, 11);
  const Reference ref = ComputeReference(b);
  const auto d = MakeLoss(GetParam()).Compute(b.Inputs()).value().diagnostics;
  double mass = 0, pos = 0, neg = 0, len = 0, imbalance = 0;
  for (int64_t p = 0; p < b.groups; ++p) {
    mass += ref.mass[p];
    pos += ref.mass[p] * ref.s_pos[p];
    neg += ref.mass[p] * ref.s_neg[p];
  }
  double nll = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < ref.adv.size(); ++i) {
    len += static_cast<double>(b.lengths[i]);
    imbalance += ref.adv[i] * ref.scale[i];
    nll += ref.scale[i] * static_cast<double>(b.lengths[i]);
    tokens += b.lengths[i];
  }
  EXPECT_NEAR(d.s_pos, pos / mass, 1e-12);
  EXPECT_NEAR(d.s_neg, neg / mass, 1e-12);
  EXPECT_NEAR(d.naive_ratio, neg / pos, 1e-12);
  EXPECT_NEAR(d.imbalance, imbalance / static_cast<double>(b.groups), 1e-12);
  EXPECT_NEAR(d.mean_response_length, len / static_cast<double>(ref.adv.size()), 1e-12);
  EXPECT_NEAR(d.mean_nll, nll / static_cast<double>(tokens), 1e-12);
  EXPECT_NEAR(d.reward_mean, ItemOf(b.rewards.mean()), 1e-12);
  EXPECT_NEAR(d.reward_std, ItemOf(b.rewards.std(false)), 1e-12);
  EXPECT_EQ(d.tokens, tokens);
  EXPECT_EQ(d.groups, 3);
  EXPECT_EQ(d.responses, 11);
}

TEST_P(EveryObjectiveTest, WorksInFloat32) {
  const Batch b = RandomBatch({4, 3}, 6, 12);
  LossInputs in = b.Inputs();
  torch::Tensor logp = b.logp.detach().to(torch::kFloat).requires_grad_(true);
  in.token_logprobs = logp;
  in.behavior_logprobs = b.behavior.to(torch::kFloat);
  in.rewards = b.rewards.to(torch::kFloat);
  const auto out = MakeLoss(GetParam()).Compute(in).value();
  EXPECT_EQ(out.loss.scalar_type(), torch::kFloat);
  const auto ref = MakeLoss(GetParam()).Compute(b.Inputs()).value();
  EXPECT_NEAR(out.diagnostics.loss, ref.diagnostics.loss, 1e-5);
  EXPECT_TRUE(torch::allclose(GradOf(out.loss, logp).to(torch::kDouble), GradOf(ref.loss, b.logp),
                              1e-4, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(AllObjectives, EveryObjectiveTest,
                         ::testing::Values(Objective::kNaive, Objective::kSpo, Objective::kAsympo,
                                           Objective::kAsympoStable, Objective::kGrpo,
                                           Objective::kGpg),
                         [](const ::testing::TestParamInfo<Objective>& info) {
                           return std::string(ObjectiveName(info.param));
                         });

}  // namespace
}  // namespace asympo::learner

namespace asympo::learner {
namespace {

using testing::GradOf;
using testing::MakeLoss;

// Rewards like 0.7 are not dyadic: the group mean rounds, and the
// advantages of an all-equal group come out as +-2e-16 rather than 0.
TEST(DegenerateGroupTest, AllEqualRewardsAreDecidedFromTheRewardsThemselves) {
  const torch::Tensor logp = torch::full({5, 2}, -1.0, torch::kDouble).requires_grad_(true);
  LossInputs in;
  in.token_logprobs = logp;
  in.mask = torch::ones({5, 2}, torch::kBool);
  // Group 0: (0.7, 0.7, 0.7), all equal; group 1: (1, 0).
  in.rewards = torch::tensor({0.7, 0.7, 0.7, 1.0, 0.0}, torch::kDouble);
  in.group_index = torch::tensor({0, 0, 0, 1, 1}, torch::kLong);
  in.num_groups = 2;
  const torch::Tensor adv =
      ComputeGroupAdvantages(in.rewards, in.group_index, 2, AdvantageOptions{}).value();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(adv[i].item<double>(), 0.0) << "response " << i;
  const auto gpg = MakeLoss(Objective::kGpg).Compute(in).value();
  // B = 5 responses, M = 3 in the all-equal group: alpha = 5 / 2.
  EXPECT_DOUBLE_EQ(gpg.diagnostics.gpg_alpha, 2.5);
  EXPECT_DOUBLE_EQ(gpg.diagnostics.degenerate_group_fraction, 0.5);
  for (Objective o : {Objective::kAsympo, Objective::kSpo, Objective::kNaive}) {
    const auto out = MakeLoss(o).Compute(in).value();
    EXPECT_DOUBLE_EQ(out.diagnostics.degenerate_group_fraction, 0.5);
    const torch::Tensor grad = GradOf(out.loss, logp);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(grad[i].abs().max().item<double>(), 0.0) << "response " << i;
    }
  }
}

// In float32, log_softmax returns exactly 0 for a token whose competitors
// hold less than about 6e-8 of the mass, while the gradient through the
// logits is not 0: such a response's scale S_g is 0 and its asympo
// coefficient A_g / S_g must not explode.
TEST(AsympoScaleFloorTest, AResponseWhoseScaleRoundsToZeroGetsAFiniteBoundedGradient) {
  // Two responses of 3 tokens over a vocabulary of 8: response 0's chosen
  // tokens lead by 20 nats (log-prob exactly 0 in float32), response 1's by 1.
  torch::Tensor logits = torch::zeros({2, 3, 8}, torch::kFloat);
  logits.select(0, 0).select(1, 1).fill_(20.0);
  logits.select(0, 1).select(1, 1).fill_(1.0);
  logits.requires_grad_(true);
  const torch::Tensor targets = torch::ones({2, 3}, torch::kLong);
  const torch::Tensor logp =
      torch::log_softmax(logits, 2).gather(2, targets.unsqueeze(2)).squeeze(2);
  ASSERT_EQ(logp[0].abs().max().item<float>(), 0.0f) << "the premise: S_0 underflows to 0";
  LossInputs in;
  in.token_logprobs = logp;
  in.mask = torch::ones({2, 3}, torch::kBool);
  in.rewards = torch::tensor({1.0, 0.0}, torch::kDouble);
  in.group_index = torch::tensor({0, 0}, torch::kLong);
  in.num_groups = 1;
  const auto out = MakeLoss(Objective::kAsympo).Compute(in).value();
  const torch::Tensor grad = GradOf(out.loss, logits);
  EXPECT_TRUE(torch::isfinite(grad).all().item<bool>());
  // The other response's gradient is O(A / S_1 / m): about 0.5; nothing may
  // be orders of magnitude beyond it.
  EXPECT_LT(grad.abs().max().item<double>(), 10.0) << grad.abs().max().item<double>();
}

TEST(AsympoStableDefaultsTest, PLowIsInThePapersRange) {
  const PolicyLossOptions o;
  EXPECT_GE(o.p_low, 0.01);
  EXPECT_LE(o.p_low, 0.05);
}

}  // namespace
}  // namespace asympo::learner
