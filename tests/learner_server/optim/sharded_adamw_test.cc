#include "learner_server/optim/sharded_adamw.h"
#include "tests/testing/one_rank_collectives.h"
#include "tests/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <map>

namespace asympo::learner {
namespace {

// One rank: every collective is the identity. Enough to check the flat
// layout (chunks, rounds, parameters straddling rounds, padding) and the
// update against AdamW; tests/integration/data_parallel_test.py runs 2 and
// 3 Gloo ranks.
using OneRank = ::asympo::testing::OneRankCollectives;

std::vector<torch::Tensor> Params(int seed) {
  torch::manual_seed(seed);
  return {torch::randn({3, 5}).requires_grad_(true), torch::randn({7}).requires_grad_(true),
          torch::randn({2, 2, 2}).requires_grad_(true), torch::randn({4}).requires_grad_(true)};
}

// Gradients of a fixed function; parameter 3 gets none.
void Backward(const std::vector<torch::Tensor>& p, int step) {
  for (const torch::Tensor& t : p) t.mutable_grad().reset();
  ((p[0] * p[0]).sum() * step + p[1].sin().sum() + (p[2] * 3).pow(3).sum()).backward();
}

TEST(ShardedAdamWTest, OneRankInSmallRoundsEqualsAdamWBitForBit) {
  AdamWOptions o;
  o.weight_decay = 0.05;
  std::vector<torch::Tensor> a = Params(1), b = Params(1);
  AdamW plain(a, o);
  OneRank one;
  ShardedAdamW sharded(b, o, &one, /*bucket_elements=*/6);  // 34 elements in 6 rounds
  EXPECT_EQ(sharded.chunk_elements(), 34);
  EXPECT_EQ(sharded.rounds(), 6);
  for (int step = 1; step <= 3; ++step) {
    Backward(a, step);
    Backward(b, step);
    double norm = 0;
    for (int i = 0; i < 3; ++i) norm += a[i].grad().pow(2).sum().item<double>();
    plain.Step(1e-2);
    absl::StatusOr<double> got = sharded.ReduceGradients();
    ASSERT_OK(got);
    EXPECT_NEAR(*got, std::sqrt(norm), 1e-5 * std::sqrt(norm));
    ASSERT_OK(sharded.Apply(1e-2, 1.0, {true, true, true, false}));
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i << " after step " << step;
    }
  }
  EXPECT_EQ(one.calls, 18);
  EXPECT_EQ(sharded.step_count(), 3);
  EXPECT_EQ(sharded.state_bytes(), 2 * 34 * 4);
}

TEST(ShardedAdamWTest, ItsCheckpointPiecesAreAdamWsStateAndItScattersBack) {
  AdamWOptions o;
  std::vector<torch::Tensor> a = Params(2), b = Params(2);
  AdamW plain(a, o);
  OneRank one;
  ShardedAdamW sharded(b, o, &one, 5);
  for (int step = 1; step <= 2; ++step) {
    Backward(a, step);
    Backward(b, step);
    plain.Step(1e-2);
    ASSERT_OK(sharded.ReduceGradients());
    ASSERT_OK(sharded.Apply(1e-2, 1.0, {true, true, true, false}));
  }
  // Its checkpoint pieces are AdamW's moments (one rank: the whole chunk),
  // parameter 3, never stepped, has none.
  EXPECT_EQ(sharded.MomentsDefined(), (std::vector<bool>{true, true, true, false}));
  std::map<std::pair<int, size_t>, at::Tensor> got;
  for (const StatePiece& p : sharded.PiecesToWrite(0, 1)) {
    ASSERT_EQ(p.begin, 0);
    got[{static_cast<int>(p.kind), p.param}] = p.data;
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(got.at({1, i}), plain.exp_avg()[i].view({-1}))) << i;
    EXPECT_TRUE(torch::equal(got.at({2, i}), plain.exp_avg_sq()[i].view({-1}))) << i;
  }
  EXPECT_EQ(got.count({1, 3}), 0u);
  // A fresh sharded optimizer takes the state back and steps on alike.
  ShardedAdamW again(b, o, &one, 5);
  ASSERT_OK(again.ScatterState(plain));
  EXPECT_EQ(again.step_count(), 2);
  Backward(a, 3);
  Backward(b, 3);
  plain.Step(1e-2);
  ASSERT_OK(again.ReduceGradients());
  ASSERT_OK(again.Apply(1e-2, 1.0, {true, true, true, false}));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(ShardedAdamWTest, ScaleClipsTheGradientBeforeTheUpdate) {
  AdamWOptions o;
  std::vector<torch::Tensor> a = Params(3), b = Params(3);
  AdamW plain(a, o);
  OneRank one;
  ShardedAdamW sharded(b, o, &one);
  Backward(a, 1);
  Backward(b, 1);
  for (int i = 0; i < 3; ++i) a[i].grad().mul_(0.25);
  plain.Step(1e-2);
  ASSERT_OK(sharded.ReduceGradients());
  ASSERT_OK(sharded.Apply(1e-2, 0.25, {true, true, true, false}));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

}  // namespace
}  // namespace asympo::learner
