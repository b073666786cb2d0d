// FullShard's read paths, with the tensor memory they take measured by a
// counting CPU allocator (every tensor of this process goes through it):
// publishing a unit at a time (VisitUnits, into the snapshot staging) holds
// at most the largest unit beyond the chunks, where a whole-model gather
// (GatherWeights) holds the whole float32 model. One rank (a world of one:
// the chunks are the whole units); tests/integration/data_parallel_test.py
// and sharded_checkpoint_test.py run real worlds of 2 and 3.
#include "learner_server/optim/full_shard.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <torch/torch.h>

#include "tests/testing/counting_allocator.h"
#include "tests/testing/one_rank_collectives.h"
#include "tests/testing/status_matchers.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"
#include "weight_broadcaster/snapshot_store.h"

namespace asympo::learner {
namespace {

using OneRank = ::asympo::testing::OneRankCollectives;

TEST(FullShardTest, PublishingAUnitAtATimeHoldsOneUnitNotTheWholeModel) {
  ModelConfig c = ModelConfig::Tiny(512);
  c.num_hidden_layers = 8;  // the model is several times its largest unit
  ModelOptions mo;
  mo.seed = 3;
  auto model = PolicyModel::CreateRandom(c, mo).value();
  std::optional<::asympo::testing::CountingAllocator::Installed> counting;
  counting.emplace();
  // Laid out while the weights are whole, as the learner's publisher is.
  auto staging = broadcast::SnapshotStaging::Create(*model, at::kFloat).value();
  OneRank one;
  AdamW state(model->parameters(), {});
  auto shard = FullShard::Create(model.get(), {}, &one, state).value();
  const int64_t whole = 4 * model->config().NumParameters();
  const int64_t unit = 4 * shard->largest_unit();
  ASSERT_GT(whole, 3 * unit);
  // Unit by unit into the (preallocated) staging buffer.
  (*counting)->Reset();
  ASSERT_OK(staging->BeginStage());
  ASSERT_OK(shard->VisitUnits(
      [&](const std::vector<size_t>& params) { return staging->StageParameters(*model, params); }));
  ASSERT_OK(staging->FinishStage());
  const int64_t by_units = (*counting)->PeakAbove();
  // The whole-model gather the publisher used before.
  (*counting)->Reset();
  ASSERT_OK(shard->GatherWeights());
  const int64_t whole_gather = (*counting)->PeakAbove();
  std::vector<at::Tensor> gathered;
  for (const at::Tensor& p : model->parameters()) gathered.push_back(p.detach().clone());
  shard->ReleaseWeights();
  counting.reset();
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

// --snapshot_staging=host: no device buffer; each gathered unit goes
// straight into the (pinned, on a GPU) host buffer the store adopts. The
// same bytes as staging through the device buffer, and still one unit held
// at a time.
TEST(FullShardTest, HostStagingAUnitAtATimeStagesTheSameBytesAndHoldsOneUnit) {
  ModelConfig c = ModelConfig::Tiny(512);
  c.num_hidden_layers = 8;
  ModelOptions mo;
  mo.seed = 5;
  auto model = PolicyModel::CreateRandom(c, mo).value();
  prometheus::Registry registry;
  broadcast::SnapshotStore store({}, broadcast::ModelSignatureOf(*model, at::kBFloat16), registry);
  auto device = broadcast::SnapshotStaging::Create(*model, at::kBFloat16, store, false).value();
  auto host = broadcast::SnapshotStaging::Create(*model, at::kBFloat16, store, false,
                                                 /*host_only=*/true)
                  .value();
  ASSERT_TRUE(host->host_only());
  ASSERT_FALSE(device->host_only());
  // Through the device buffer, while the weights are whole.
  ASSERT_OK(device->Stage(*model));
  const std::vector<broadcast::TensorView> through_device = device->CopyToHost().value();
  OneRank one;
  AdamW state(model->parameters(), {});
  auto shard = FullShard::Create(model.get(), {}, &one, state).value();
  const int64_t unit = 4 * shard->largest_unit();
  ASSERT_GT(4 * model->config().NumParameters(), 3 * unit);
  std::optional<::asympo::testing::CountingAllocator::Installed> counting;
  counting.emplace();
  (*counting)->Reset();
  ASSERT_OK(host->BeginStage());
  ASSERT_OK(shard->VisitUnits(
      [&](const std::vector<size_t>& params) { return host->StageParameters(*model, params); }));
  ASSERT_OK(host->FinishStage());
  const std::vector<broadcast::TensorView> through_host = host->CopyToHost().value();
  const int64_t peak = (*counting)->PeakAbove();
  counting.reset();
  EXPECT_LE(peak, unit + (int64_t{64} << 10)) << "largest unit " << unit;
  ASSERT_EQ(through_host.size(), through_device.size());
  for (size_t i = 0; i < through_host.size(); ++i) {
    ASSERT_EQ(through_host[i].size_bytes, through_device[i].size_bytes);
    EXPECT_EQ(std::memcmp(through_host[i].data, through_device[i].data, through_host[i].size_bytes),
              0)
        << through_host[i].spec.name;
  }
}

}  // namespace
}  // namespace asympo::learner
