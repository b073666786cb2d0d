// FullShard's read paths, with the tensor memory they take measured by a
// counting CPU allocator (every tensor of this process goes through it):
// publishing a unit at a time (VisitUnits, into the snapshot staging) holds
// at most the largest unit beyond the chunks, where a whole-model gather
// (GatherWeights) holds the whole float32 model. One rank (a world of one:
// the chunks are the whole units); tests/integration/data_parallel_test.py
// and sharded_checkpoint_test.py run real worlds of 2 and 3.
#include "learner_server/optim/full_shard.h"

#include <algorithm>
#include <atomic>

#include <c10/core/CPUAllocator.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/testing/one_rank_collectives.h"
#include "tests/testing/status_matchers.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::learner {
namespace {

using OneRank = ::asympo::testing::OneRankCollectives;

// Counts the bytes of live CPU tensors and their peak.
class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) const override {
    auto* ctx = new Context{base_->allocate(n), n, this};
    const int64_t live = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return {ctx->inner.get(), ctx, &Delete, ctx->inner.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // The peak since the last reset, above the bytes live at the reset.
  void Reset() { peak_ = live_.load(), base_live_ = live_.load(); }
  int64_t PeakAbove() const { return peak_.load() - base_live_; }

 private:
  struct Context {
    c10::DataPtr inner;
    size_t n;
    const CountingAllocator* owner;
  };
  static void Delete(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->live_.fetch_sub(static_cast<int64_t>(ctx->n));
    delete ctx;
  }
  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0}, peak_{0};
  int64_t base_live_ = 0;
};

TEST(FullShardTest, PublishingAUnitAtATimeHoldsOneUnitNotTheWholeModel) {
  ModelConfig c = ModelConfig::Tiny(512);
  c.num_hidden_layers = 8;  // the model is several times its largest unit
  ModelOptions mo;
  mo.seed = 3;
  auto model = PolicyModel::CreateRandom(c, mo).value();
  static CountingAllocator counting(c10::GetCPUAllocator());
  c10::Allocator* const original = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  // Laid out while the weights are whole, as the learner's publisher is.
  auto staging = broadcast::SnapshotStaging::Create(*model, at::kFloat).value();
  OneRank one;
  AdamW state(model->parameters(), {});
  auto shard = FullShard::Create(model.get(), {}, &one, state).value();
  const int64_t whole = 4 * model->config().NumParameters();
  const int64_t unit = 4 * shard->largest_unit();
  ASSERT_GT(whole, 3 * unit);
  // Unit by unit into the (preallocated) staging buffer.
  counting.Reset();
  ASSERT_OK(staging->BeginStage());
  ASSERT_OK(shard->VisitUnits(
      [&](const std::vector<size_t>& params) { return staging->StageParameters(*model, params); }));
  ASSERT_OK(staging->FinishStage());
  const int64_t by_units = counting.PeakAbove();
  // The whole-model gather the publisher used before.
  counting.Reset();
  ASSERT_OK(shard->GatherWeights());
  const int64_t whole_gather = counting.PeakAbove();
  std::vector<at::Tensor> gathered;
  for (const at::Tensor& p : model->parameters()) gathered.push_back(p.detach().clone());
  shard->ReleaseWeights();
  c10::SetCPUAllocator(original, /*priority=*/100);
  EXPECT_LE(by_units, unit + (int64_t{64} << 10)) << "largest unit " << unit;
  EXPECT_GE(whole_gather, whole);
  // The staged copy is the model's weights.
  const std::vector<broadcast::TensorView> views = staging->CopyToHost().value();
  for (size_t i = 0; i < views.size(); ++i) {
    const at::Tensor staged =
        at::from_blob(const_cast<void*>(static_cast<const void*>(views[i].data)),
                      {static_cast<int64_t>(views[i].size_bytes / 4)});
    EXPECT_TRUE(torch::equal(staged, gathered[i].reshape({-1}))) << views[i].spec.name;
  }
}

}  // namespace
}  // namespace asympo::learner
