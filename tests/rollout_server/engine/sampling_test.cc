#include "rollout_server/engine/sampling.h"

#include <cmath>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "rollout_server/engine/generation.h"

namespace asympo::rollout {
namespace {

// Uniforms for seeds 0..seeds-1 at steps 0..steps-1, flattened.
std::vector<double> Uniforms(int64_t seeds, int64_t steps, int64_t seed_base = 0) {
  const torch::Tensor s = torch::arange(seed_base, seed_base + seeds, torch::kLong);
  std::vector<double> out;
  for (int64_t t = 0; t < steps; ++t) {
    const torch::Tensor u = CounterUniform(s, torch::full({1}, t, torch::kLong));
    for (int64_t i = 0; i < seeds; ++i) out.push_back(u[i].item<double>());
  }
  return out;
}

TEST(CounterUniformTest, IsUniformOnZeroOneAndDeterministic) {
  const std::vector<double> u = Uniforms(2000, 50);
  std::vector<int64_t> bins(20, 0);
  double mean = 0;
  for (double x : u) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    ++bins[static_cast<size_t>(x * 20)];
    mean += x;
  }
  mean /= static_cast<double>(u.size());
  EXPECT_NEAR(mean, 0.5, 0.005);
  // Chi-square with 19 degrees of freedom: 43.8 is its 0.999 quantile.
  const double expected = static_cast<double>(u.size()) / 20;
  double chi2 = 0;
  for (int64_t b : bins) chi2 += (b - expected) * (b - expected) / expected;
  EXPECT_LT(chi2, 43.8);
  EXPECT_EQ(Uniforms(7, 3), Uniforms(7, 3));
}

TEST(CounterUniformTest, NeighbouringSeedsAndStepsAreUncorrelated) {
  // Lag-1 correlation along steps and along seeds.
  const int64_t seeds = 400, steps = 100;
  const std::vector<double> u = Uniforms(seeds, steps);
  double along_steps = 0, along_seeds = 0;
  int64_t n_steps = 0, n_seeds = 0;
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t i = 0; i < seeds; ++i) {
      const double x = u[t * seeds + i] - 0.5;
      if (t + 1 < steps) along_steps += x * (u[(t + 1) * seeds + i] - 0.5), ++n_steps;
      if (i + 1 < seeds) along_seeds += x * (u[t * seeds + i + 1] - 0.5), ++n_seeds;
    }
  }
  // Variance of U(0,1) is 1/12; 4 standard errors of a zero correlation.
  EXPECT_LT(std::abs(along_steps / n_steps * 12), 4 / std::sqrt(static_cast<double>(n_steps)));
  EXPECT_LT(std::abs(along_seeds / n_seeds * 12), 4 / std::sqrt(static_cast<double>(n_seeds)));
}

TEST(CounterUniformTest, UsesAllSixtyFourSeedBits) {
  const torch::Tensor seeds = torch::tensor(
      std::vector<int64_t>{5, 5 + (int64_t{1} << 32), -5, std::numeric_limits<int64_t>::min()},
      torch::kLong);
  const torch::Tensor u = CounterUniform(seeds, torch::zeros({1}, torch::kLong));
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) EXPECT_NE(u[i].item<double>(), u[j].item<double>());
  }
}

// Empirical token frequencies over `draws` seeds against `expected`.
void ExpectDistribution(const torch::Tensor& logits, const SamplingParams& base,
                        const std::vector<double>& expected, int64_t draws = 40000) {
  std::vector<SamplingParams> params(static_cast<size_t>(draws), base);
  std::vector<const SamplingParams*> ptrs;
  for (int64_t i = 0; i < draws; ++i) {
    params[static_cast<size_t>(i)].seed = static_cast<uint64_t>(i) * 7919 + 3;
    ptrs.push_back(&params[static_cast<size_t>(i)]);
  }
  const BatchSampler sampler(ptrs, torch::kCPU);
  const torch::Tensor tokens = sampler.Sample(logits.unsqueeze(0).expand({draws, -1}).contiguous(),
                                              torch::full({1}, 4, torch::kLong));
  const torch::Tensor counts = torch::bincount(tokens, {}, logits.size(0)).to(torch::kDouble);
  for (int64_t v = 0; v < logits.size(0); ++v) {
    const double p = expected[static_cast<size_t>(v)];
    const double got = counts[v].item<double>() / static_cast<double>(draws);
    const double sigma = std::sqrt(std::max(p * (1 - p), 1e-12) / static_cast<double>(draws));
    if (p == 0) {
      EXPECT_EQ(got, 0) << "token " << v << " must never be drawn";
    } else {
      EXPECT_NEAR(got, p, 5 * sigma) << "token " << v;
    }
  }
}

std::vector<double> Softmax(const std::vector<double>& x, double t) {
  double m = *std::max_element(x.begin(), x.end()), z = 0;
  std::vector<double> p;
  for (double v : x) p.push_back(std::exp((v - m) / t)), z += p.back();
  for (double& v : p) v /= z;
  return p;
}

const std::vector<double> kLogits = {1.0, 2.5, 0.3, -1.0, 2.0, 0.0, 1.7, -0.5};

TEST(BatchSamplerTest, DrawsFromTheTemperatureScaledSoftmax) {
  const torch::Tensor logits = torch::tensor(kLogits, torch::kFloat);
  SamplingParams p;
  p.temperature = 0.7;
  ExpectDistribution(logits, p, Softmax(kLogits, 0.7));
  p.temperature = 1.0;
  ExpectDistribution(logits.to(torch::kBFloat16), p,
                     Softmax(std::vector<double>(kLogits.begin(), kLogits.end()), 1.0));
}

TEST(BatchSamplerTest, TopKAndTopPRenormalizeOverTheKeptTokens) {
  const torch::Tensor logits = torch::tensor(kLogits, torch::kFloat);
  // Sorted: 2.5 (1), 2.0 (4), 1.7 (6), 1.0 (0), ...
  SamplingParams k3;
  k3.top_k = 3;
  std::vector<double> masked(kLogits.size(), -INFINITY);
  for (int v : {1, 4, 6}) masked[static_cast<size_t>(v)] = kLogits[static_cast<size_t>(v)];
  ExpectDistribution(logits, k3, Softmax(masked, 1.0));
  // Top-p 0.75: token 1 (p = 0.39) and token 4 (0.24) reach 0.63 < 0.75,
  // so token 6 (0.18) is kept too; the rest go.
  SamplingParams p6;
  p6.top_p = 0.75;
  const std::vector<double> full = Softmax(kLogits, 1.0);
  ASSERT_LT(full[1] + full[4], 0.75);
  ASSERT_GE(full[1] + full[4] + full[6], 0.75);
  ExpectDistribution(logits, p6, Softmax(masked, 1.0));
}

// A plain sampled row, a top-k/top-p row and a greedy row.
std::tuple<SamplingParams, SamplingParams, SamplingParams> ThreeRows() {
  SamplingParams plain, nucleus, greedy;
  plain.seed = 42;
  nucleus.seed = 43;
  nucleus.top_p = 0.8;
  nucleus.top_k = 10;
  greedy.temperature = 0;
  return {plain, nucleus, greedy};
}

TEST(BatchSamplerTest, ARowsTokenDoesNotDependOnItsBatch) {
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({3, 50});
  const auto [plain, nucleus, greedy] = ThreeRows();
  const torch::Tensor step = torch::full({1}, 9, torch::kLong);
  const torch::Tensor batch =
      BatchSampler({&plain, &nucleus, &greedy}, torch::kCPU).Sample(logits, step);
  EXPECT_EQ(
      batch[0].item<int64_t>(),
      BatchSampler({&plain}, torch::kCPU).Sample(logits.narrow(0, 0, 1), step).item<int64_t>());
  EXPECT_EQ(
      batch[1].item<int64_t>(),
      BatchSampler({&nucleus}, torch::kCPU).Sample(logits.narrow(0, 1, 1), step).item<int64_t>());
  EXPECT_EQ(batch[2].item<int64_t>(), logits[2].argmax().item<int64_t>());
  EXPECT_EQ(batch[0].item<int64_t>(), SampleToken(logits[0], plain, 9));
}

TEST(BatchSamplerTest, SlotRowsSampleAsABatchBuiltWithTheirParameters) {
  torch::manual_seed(4);
  const torch::Tensor logits = torch::randn({3, 50});
  const auto [plain, nucleus, greedy] = ThreeRows();
  BatchSampler slots(3, torch::kCPU);
  EXPECT_EQ(slots.path(), 1);  // nothing set yet: greedy only
  slots.SetRow(2, greedy);
  slots.SetRow(0, plain);
  slots.SetRow(1, nucleus);
  EXPECT_EQ(slots.path(), 2 | 4);
  // A step per row: each row's token is the one its own step draws.
  const torch::Tensor steps = torch::tensor(std::vector<int64_t>{9, 0, 5}, torch::kLong);
  const torch::Tensor got = slots.Sample(logits, steps);
  EXPECT_EQ(got[0].item<int64_t>(), SampleToken(logits[0], plain, 9));
  EXPECT_EQ(got[1].item<int64_t>(), SampleToken(logits[1], nucleus, 0));
  EXPECT_EQ(got[2].item<int64_t>(), logits[2].argmax().item<int64_t>());
  // Paths only widen: a plain row in a sorting sampler draws the same token.
  slots.SetRow(1, plain);
  EXPECT_EQ(slots.path(), 2 | 4);
  EXPECT_EQ(slots.Sample(logits, steps)[1].item<int64_t>(), SampleToken(logits[1], plain, 0));
}

}  // namespace
}  // namespace asympo::rollout
