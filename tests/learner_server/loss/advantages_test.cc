#include "learner_server/loss/advantages.h"
#include "tests/testing/status_matchers.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

TEST(AdvantagesTest, SubtractsTheGroupMeanPerGroup) {
  const torch::Tensor r = torch::tensor({1.0, 0.0, 0.0, 0.5, 0.25}, torch::kFloat);
  const torch::Tensor g = torch::tensor({0, 0, 0, 1, 1}, torch::kLong);
  const torch::Tensor a = ComputeGroupAdvantages(r, g, 2).value();
  EXPECT_EQ(a.scalar_type(), torch::kDouble);
  const std::vector<double> expect = {2.0 / 3, -1.0 / 3, -1.0 / 3, 0.125, -0.125};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(a[i].item<double>(), expect[i], 1e-15) << i;
}

TEST(AdvantagesTest, GroupsNeedNotBeContiguous) {
  const torch::Tensor r = torch::tensor({1.0, 3.0, 0.0, 5.0}, torch::kDouble);
  const torch::Tensor g = torch::tensor({1, 0, 1, 0}, torch::kLong);
  const torch::Tensor a = ComputeGroupAdvantages(r, g, 2).value();
  EXPECT_TRUE(torch::equal(a, torch::tensor({0.5, -1.0, -0.5, 1.0}, torch::kDouble)));
}

TEST(AdvantagesTest, MeanStdDividesByTheUnbiasedGroupStd) {
  const torch::Tensor r = torch::tensor({1.0, 0.0, 0.0, 1.0, 1.0}, torch::kDouble);
  const torch::Tensor g = torch::tensor({0, 0, 0, 1, 1}, torch::kLong);
  AdvantageOptions o;
  o.normalization = AdvantageNormalization::kMeanStd;
  o.std_epsilon = 1e-6;
  const torch::Tensor a = ComputeGroupAdvantages(r, g, 2, o).value();
  // Group 0: mean 1/3, unbiased std sqrt(1/3).
  const double sd = std::sqrt(1.0 / 3.0);
  EXPECT_NEAR(a[0].item<double>(), (2.0 / 3) / (sd + 1e-6), 1e-12);
  EXPECT_NEAR(a[1].item<double>(), (-1.0 / 3) / (sd + 1e-6), 1e-12);
  // Group 1: all rewards equal, advantages exactly 0.
  EXPECT_EQ(a[3].item<double>(), 0.0);
  EXPECT_EQ(a[4].item<double>(), 0.0);
}

TEST(AdvantagesTest, ParsesNormalizationNames) {
  EXPECT_EQ(ParseAdvantageNormalization("mean").value(), AdvantageNormalization::kMean);
  EXPECT_EQ(ParseAdvantageNormalization("mean_std").value(), AdvantageNormalization::kMeanStd);
  EXPECT_THAT(
      ParseAdvantageNormalization("std"),
      StatusIs(absl::StatusCode::kInvalidArgument, "unknown advantage normalization \"std\""));
}

TEST(AdvantagesTest, RejectsBadGroupsAndRewards) {
  const torch::Tensor r = torch::tensor({1.0, 0.0, 0.5}, torch::kDouble);
  EXPECT_THAT(ComputeGroupAdvantages(r, torch::tensor({0, 0, 1}, torch::kLong), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "group 1 has 1 response"));
  EXPECT_THAT(ComputeGroupAdvantages(r, torch::tensor({0, 0, 0}, torch::kLong), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "group 1 is empty"));
  EXPECT_THAT(ComputeGroupAdvantages(r, torch::tensor({0, 0, 0}, torch::kInt), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "group_index must be int64"));
  EXPECT_THAT(ComputeGroupAdvantages(torch::tensor({1.0, -std::numeric_limits<double>::infinity()}),
                                     torch::tensor({0, 0}, torch::kLong), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "reward of response 1 is -inf"));
  EXPECT_THAT(ComputeGroupAdvantages(torch::zeros({0}), torch::zeros({0}, torch::kLong), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "batch has no responses"));
  EXPECT_THAT(
      ComputeGroupAdvantages(torch::tensor({1, 2}, torch::kLong),
                             torch::tensor({0, 0}, torch::kLong), 1),
      StatusIs(absl::StatusCode::kInvalidArgument, "rewards must be a floating-point tensor"));
}

}  // namespace
}  // namespace asympo::learner
