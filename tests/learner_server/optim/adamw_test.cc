#include "learner_server/optim/adamw.h"
#include "tests/testing/status_matchers.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

TEST(AdamWTest, MatchesTheClosedFormUpdate) {
  torch::Tensor p = torch::tensor({1.0, -2.0}, torch::kDouble).requires_grad_(true);
  AdamWOptions o;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  AdamW opt({p}, o);
  const double lr = 0.01;
  double x[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  for (int step = 1; step <= 3; ++step) {
    opt.ZeroGrad();
    (p * p).sum().backward();  // g = 2p
    opt.Step(lr);
    for (int i = 0; i < 2; ++i) {
      const double g = 2 * x[i];
      x[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double mh = m[i] / (1 - std::pow(o.beta1, step));
      const double vh = v[i] / (1 - std::pow(o.beta2, step));
      x[i] -= lr * mh / (std::sqrt(vh) + o.eps);
      EXPECT_NEAR(p[i].item<double>(), x[i], 1e-12) << "step " << step;
    }
  }
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(AdamWTest, StateRoundTripsBitExactly) {
  torch::manual_seed(0);
  torch::Tensor a = torch::randn({3, 4}).requires_grad_(true);
  torch::Tensor b = a.detach().clone().requires_grad_(true);
  AdamW oa({a}, {}), ob({b}, {});
  for (int i = 0; i < 2; ++i) {
    oa.ZeroGrad();
    (a * a).sum().backward();
    oa.Step(1e-2);
  }
  // b takes a's weights and optimizer state, then both take one more step.
  {
    torch::NoGradGuard g;
    b.copy_(a);
  }
  ASSERT_OK(ob.LoadState(oa.StateTensors(), oa.step_count()));
  for (auto* pair : {&oa, &ob}) {
    torch::Tensor& t = pair == &oa ? a : b;
    pair->ZeroGrad();
    (t * t).sum().backward();
    pair->Step(1e-2);
  }
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(AdamWTest, SplitsItsWholeStateBetweenCheckpointWriters) {
  torch::Tensor a = torch::ones({3, 4}).requires_grad_(true);
  torch::Tensor unused = torch::ones({5}).requires_grad_(true);
  AdamW o({a, unused}, {});
  EXPECT_EQ(o.state_bytes(), 0);  // no moments before a step
  (a * a).sum().backward();
  o.Step(1e-2);
  EXPECT_EQ(o.state_bytes(), 2 * 12 * 4);  // `unused` never had a gradient
  const Optimizer& as_optimizer = o;
  EXPECT_EQ(as_optimizer.MomentsDefined(), (std::vector<bool>{true, false}));
  EXPECT_EQ(as_optimizer.steps(), 1);
  // Two writers split every tensor; the never-stepped one has no moments.
  const std::vector<StatePiece> first = as_optimizer.PiecesToWrite(0, 2);
  const std::vector<StatePiece> second = as_optimizer.PiecesToWrite(1, 2);
  ASSERT_EQ(first.size(), 4u);  // a's weight and moments, unused's weight
  EXPECT_EQ(first[0].data.numel() + second[0].data.numel(), 12);
  EXPECT_EQ(second[0].begin, 6);
  EXPECT_TRUE(torch::equal(second[1].data, o.exp_avg()[0].view({-1}).narrow(0, 6, 6)));
}

TEST(AdamWTest, RejectsBadOptionsAndState) {
  AdamWOptions o;
  o.beta2 = 1.0;
  EXPECT_THAT(ValidateAdamWOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, "beta2 is 1"));
  torch::Tensor p = torch::zeros({2}).requires_grad_(true);
  AdamW opt({p}, {});
  EXPECT_THAT(opt.LoadState({{"exp_avg.0", torch::zeros({3})}}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"exp_avg.0\" has the wrong shape"));
  EXPECT_THAT(opt.LoadState({{"momentum.0", torch::zeros({2})}}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not one of this optimizer's"));
  EXPECT_THAT(opt.LoadState({{"exp_avg.0", torch::zeros({2})}}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "one moment but not the other"));
}

}  // namespace
}  // namespace asympo::learner
