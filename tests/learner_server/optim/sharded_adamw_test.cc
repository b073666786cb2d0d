#include "learner_server/optim/sharded_adamw.h"
#include "tests/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace asympo::learner {
namespace {

// One rank: every collective is the identity. Enough to check the flat
// layout (chunks, rounds, parameters straddling rounds, padding) and the
// update against AdamW; tests/integration/data_parallel_test.py runs 2 and
// 3 Gloo ranks.
class OneRank : public ShardCollectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status ReduceScatter(std::vector<at::Tensor>& inputs, at::Tensor& output) override {
    ++calls;
    output.copy_(inputs[0]);
    return absl::OkStatus();
  }
  absl::Status AllGather(at::Tensor& input, std::vector<at::Tensor>& outputs) override {
    outputs[0].copy_(input);
    return absl::OkStatus();
  }
  absl::Status GatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs) override {
    outputs[0].copy_(input);
    return absl::OkStatus();
  }
  absl::Status ScatterFromRank0(std::vector<at::Tensor>& inputs, at::Tensor& output) override {
    output.copy_(inputs[0]);
    return absl::OkStatus();
  }
  absl::Status SumValues(std::vector<double>*) override { return absl::OkStatus(); }
  int calls = 0;
};

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

TEST(ShardedAdamWTest, GatheredStateIsAdamWsAndScattersBack) {
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
  AdamW full(b, o);
  ASSERT_OK(sharded.GatherState(&full));
  EXPECT_EQ(full.step_count(), 2);
  const auto want = plain.StateTensors(), got = full.StateTensors();
  ASSERT_EQ(got.size(), want.size());  // parameter 3, never stepped, has none
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << want[i].first;
  }
  sharded.ReleaseState(&full);
  EXPECT_TRUE(full.StateTensors().empty());
  EXPECT_EQ(full.step_count(), 2);
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
