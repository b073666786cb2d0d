// ChunkedTokenLogProbs equals the unchunked computation and stays within its
// stated peak-memory bound.
#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "common/model/cpu_memory.h"
#include "learner_server/loss/token_logprobs.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::CpuMemory;
using ::asympo::testing::StatusIs;

TEST(ChunkedLogProbsTest, EqualsUnchunkedValuesAndGradients) {
  torch::manual_seed(1);
  const int64_t m = 37, h = 16, v = 50;
  for (int64_t chunk : {1, 5, 37, 100}) {
    torch::Tensor hidden = torch::randn({m, h}, torch::kDouble).requires_grad_(true);
    torch::Tensor weight = torch::randn({v, h}, torch::kDouble).requires_grad_(true);
    const torch::Tensor targets = torch::randint(0, v, {m}, torch::kLong);
    const torch::Tensor w = torch::randn({m}, torch::kDouble);
    const torch::Tensor chunked = ChunkedTokenLogProbs(hidden, weight, targets, chunk).value();
    const auto g1 =
        torch::autograd::grad({(chunked.to(torch::kDouble) * w).sum()}, {hidden, weight});
    const torch::Tensor ref =
        torch::log_softmax(torch::matmul(hidden, weight.t()), 1).gather(1, targets.unsqueeze(1));
    const auto g2 = torch::autograd::grad({(ref.squeeze(1) * w).sum()}, {hidden, weight});
    // The chunked path works in float32 (as the trainer does).
    EXPECT_TRUE(torch::allclose(chunked.to(torch::kDouble), ref.squeeze(1), 1e-5, 1e-5)) << chunk;
    EXPECT_TRUE(torch::allclose(g1[0], g2[0], 1e-4, 1e-5)) << chunk;
    EXPECT_TRUE(torch::allclose(g1[1], g2[1], 1e-4, 1e-5)) << chunk;
  }
}

// A frozen output projection (low-rank adapters) gets no gradient, and its
// (V, H) float32 gradient buffer is never allocated; the hidden states'
// gradient is the same as when the weight trains.
TEST(ChunkedLogProbsTest, AFrozenWeightGetsNoGradientNorItsBuffer) {
  torch::manual_seed(2);
  const int64_t m = 8, h = 64, v = 4096;
  const torch::Tensor targets = torch::randint(0, v, {m}, torch::kLong);
  const torch::Tensor frozen = torch::randn({v, h});
  const torch::Tensor trained = frozen.clone().requires_grad_(true);
  torch::Tensor hidden = torch::randn({m, h}).requires_grad_(true);
  const auto both = torch::autograd::grad(
      {ChunkedTokenLogProbs(hidden, trained, targets, 4).value().sum()}, {hidden, trained});
  CpuMemory& memory = CpuMemory::Install();
  const torch::Tensor out = ChunkedTokenLogProbs(hidden, frozen, targets, 4).value().sum();
  memory.ResetPeak();
  const int64_t before = memory.current();
  const auto alone = torch::autograd::grad({out}, {hidden});
  EXPECT_TRUE(torch::equal(alone[0], both[0]));
  // Two chunks' (4, V) float32 buffers and the gradient; not (V, H) floats.
  EXPECT_LT(memory.peak() - before, v * h * 4 / 2);
}

TEST(ChunkedLogProbsTest, RejectsBadInputs) {
  const torch::Tensor hidden = torch::randn({4, 8});
  const torch::Tensor weight = torch::randn({10, 8});
  EXPECT_THAT(ChunkedTokenLogProbs(hidden, weight, torch::tensor({1, 2, 3, 10}), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "target id 10 is outside the vocabulary [0, 10)"));
  EXPECT_THAT(ChunkedTokenLogProbs(hidden, torch::randn({10, 7}), torch::tensor({1, 2, 3, 4}), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "weight must be (V, 8)"));
  EXPECT_THAT(ChunkedTokenLogProbs(hidden, weight, torch::tensor({1, 2, 3, 4}), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk_rows must be positive"));
}

TEST(ChunkedLogProbsTest, PeakMemoryStaysWithinTheStatedBound) {
  CpuMemory* tracker = &CpuMemory::Install();
  at::set_num_threads(1);  // per-thread reduction buffers are not in the bound
  const int64_t m = 2048, h = 64, v = 8192, chunk = 128;
  torch::manual_seed(2);
  torch::Tensor hidden = torch::randn({m, h}).requires_grad_(true);
  torch::Tensor weight = torch::randn({v, h}).requires_grad_(true);
  const torch::Tensor targets = torch::randint(0, v, {m}, torch::kLong);
  // Inputs, their gradients and the output are outside the bound: count
  // them as a baseline by allocating their sizes up front.
  const int64_t baseline_extra = (m * h + v * h) * 4 /*grads*/ + m * 4 /*out*/ + m * 4 /*grad out*/;
  tracker->ResetPeak();
  const int64_t before = tracker->current();
  const torch::Tensor out = ChunkedTokenLogProbs(hidden, weight, targets, chunk).value();
  out.sum().backward();
  const int64_t used = tracker->peak() - before;
  const int64_t bound = ChunkedLogProbsPeakBytes(m, v, chunk) + baseline_extra;
  // Unchunked would need 2 * m * v * 4 = 128 MiB; the bound is ~8.6 MiB.
  EXPECT_LE(used, bound + (1 << 20)) << "used " << used << " bytes, bound " << bound;
  EXPECT_LT(used, 2 * m * v * 4 / 8);
  // The tracker does see big allocations: the unchunked path breaks the bound.
  hidden.mutable_grad().reset();
  weight.mutable_grad().reset();
  tracker->ResetPeak();
  const int64_t before_full = tracker->current();
  torch::log_softmax(torch::matmul(hidden, weight.t()), 1)
      .gather(1, targets.unsqueeze(1))
      .sum()
      .backward();
  EXPECT_GT(tracker->peak() - before_full, bound * 4);
}

}  // namespace
}  // namespace asympo::learner
