// ChunkedTokenLogProbs equals the unchunked computation and stays within its
// stated peak-memory bound.
#include <atomic>
#include <cstring>
#include <memory>

#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/version.h>

#include "learner_server/token_logprobs.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

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

// Wraps the CPU allocator to track live and peak bytes.
class TrackingAllocator : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}
// LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DataPtr Allocate(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    auto* ctx = new Ctx{std::move(inner), n, this};
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, ctx, &Delete, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void ResetPeak() { peak_ = live_.load(); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  struct Ctx {
    c10::DataPtr inner;
    size_t n;
    const TrackingAllocator* owner;
  };
  static void Delete(void* p) {
    auto* ctx = static_cast<Ctx*>(p);
    ctx->owner->live_.fetch_sub(static_cast<int64_t>(ctx->n));
    delete ctx;
  }
  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

TEST(ChunkedLogProbsTest, PeakMemoryStaysWithinTheStatedBound) {
  static TrackingAllocator* tracker = new TrackingAllocator(c10::GetCPUAllocator());
  c10::SetAllocator(c10::kCPU, tracker, /*priority=*/100);
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
  const int64_t before = tracker->live();
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
  const int64_t before_full = tracker->live();
  torch::log_softmax(torch::matmul(hidden, weight.t()), 1)
      .gather(1, targets.unsqueeze(1))
      .sum()
      .backward();
  EXPECT_GT(tracker->peak() - before_full, bound * 4);
  c10::SetAllocator(c10::kCPU, c10::GetDefaultCPUAllocator(), /*priority=*/101);
}

}  // namespace
}  // namespace asympo::learner
