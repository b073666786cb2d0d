#include "learner_server/snapshot_publisher.h"

#include <cstring>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "learner_server/learner_metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

TEST(SnapshotStagingTest, AStagedCopyIsConsistentAndInThePublishDtype) {
  auto model = Tiny();
  auto staging = broadcast::SnapshotStaging::Create(*model, at::kBFloat16).value();
  std::vector<torch::Tensor> expected;
  for (const auto& p : model->parameters()) expected.push_back(p.detach().to(torch::kBFloat16));
  ASSERT_OK(staging->Stage(*model));
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : model->parameters()) p.add_(1.0);  // the next optimizer step
  }
  const auto views = staging->CopyToHost().value();
  ASSERT_EQ(views.size(), expected.size());
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_EQ(views[i].spec.dtype, v1::DTYPE_BF16);
    EXPECT_EQ(views[i].spec.name, model->named_parameters()[i].first);
    ASSERT_EQ(views[i].size_bytes, static_cast<uint64_t>(expected[i].numel() * 2));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(views[i].data) % 64, 0u) << "64-byte aligned";
    EXPECT_EQ(std::memcmp(views[i].data, expected[i].data_ptr(), views[i].size_bytes), 0)
        << views[i].spec.name;
  }
  EXPECT_EQ(broadcast::ModelSignature(broadcast::ModelTensorSpecs(*model, at::kBFloat16)),
            broadcast::ModelSignatureOf(*model, at::kBFloat16));
  EXPECT_NE(broadcast::ModelSignatureOf(*model, at::kBFloat16),
            broadcast::ModelSignatureOf(*model));
}

TEST(SnapshotStagingTest, InTheBucketLayoutTheDeviceCopyIsTheSnapshotsBuckets) {
  auto model = Tiny();
  broadcast::PackingOptions packing;
  packing.bucket_bytes = 4096;
  auto staging = broadcast::SnapshotStaging::Create(*model, at::kBFloat16, &packing).value();
  ASSERT_OK(staging->Stage(*model));
  const auto views = staging->CopyToHost().value();
  broadcast::DeviceBuckets device = staging->DeviceBucketsOfStage();
  const v1::SnapshotManifest plan =
      broadcast::PlanSnapshot(broadcast::ModelTensorSpecs(*model, at::kBFloat16), 0, packing)
          .value();
  ASSERT_GT(plan.buckets_size(), 1);
  EXPECT_EQ(staging->plan().manifest().SerializeAsString(), plan.SerializeAsString());
  ASSERT_NE(device.data, nullptr);
  for (int t = 0; t < plan.tensors_size(); ++t) {
    const v1::TensorEntry& e = plan.tensors(t);
    const char* in_bucket = static_cast<const char*>(device.data) +
                            staging->plan().bucket_start(static_cast<int>(e.bucket())) + e.offset();
    ASSERT_EQ(views[static_cast<size_t>(t)].size_bytes, e.size_bytes());
    EXPECT_EQ(std::memcmp(in_bucket, views[static_cast<size_t>(t)].data, e.size_bytes()), 0)
        << e.name();
  }
  // While a snapshot holds those buckets, the next stage goes elsewhere;
  // once it lets go, the buffer is used again.
  ASSERT_OK(staging->Stage(*model));
  ASSERT_OK(staging->CopyToHost());
  broadcast::DeviceBuckets second = staging->DeviceBucketsOfStage();
  EXPECT_NE(second.data, device.data);
  const void* first_buffer = device.data;
  const void* second_buffer = second.data;
  device.keep_alive.reset();  // the snapshots let go
  second.keep_alive.reset();
  ASSERT_OK(staging->Stage(*model));
  ASSERT_OK(staging->CopyToHost());
  const void* third = staging->DeviceBucketsOfStage().data;
  EXPECT_TRUE(third == first_buffer || third == second_buffer) << "a third buffer was allocated";
  // Without the bucket layout there are no device buckets.
  auto plain = broadcast::SnapshotStaging::Create(*model, at::kBFloat16).value();
  ASSERT_OK(plain->Stage(*model));
  EXPECT_EQ(plain->DeviceBucketsOfStage().data, nullptr);
}

TEST(SnapshotStagingTest, TheHostCopyIsLaidOutAsTheStoresBucketsAndAdopted) {
  auto model = Tiny();
  prometheus::Registry registry;
  broadcast::SnapshotStore store({}, broadcast::ModelSignatureOf(*model, at::kBFloat16), registry);
  ASSERT_OK_AND_ASSIGN(auto staging,
                       broadcast::SnapshotStaging::Create(*model, at::kBFloat16, store, false));
  ASSERT_OK_AND_ASSIGN(auto plan, store.Plan(broadcast::ModelTensorSpecs(*model, at::kBFloat16)));
  ASSERT_OK(staging->Stage(*model));
  ASSERT_OK_AND_ASSIGN(const auto views, staging->CopyToHost());
  broadcast::HostBuckets first = staging->HostBucketsOfCopy();
  EXPECT_EQ(first.plan, plan) << "the store's own plan";
  for (size_t t = 0; t < views.size(); ++t) {
    EXPECT_EQ(views[t].data, first.data + plan->tensor_start(static_cast<int>(t)));
  }
  const char* first_buffer = first.data;
  ASSERT_OK(store.Publish(1, std::move(first)));
  // While the store holds version 1's buckets, the next copy goes elsewhere;
  // once version 2 replaces it, the first buffer is used again.
  ASSERT_OK(staging->CopyToHost());
  const char* second_buffer = staging->HostBucketsOfCopy().data;
  EXPECT_NE(second_buffer, first_buffer);
  ASSERT_OK(store.Publish(2, staging->HostBucketsOfCopy()));
  ASSERT_OK(staging->CopyToHost());
  EXPECT_EQ(staging->HostBucketsOfCopy().data, first_buffer);
  // Without the store's plan, the store refuses the copy.
  auto plain = broadcast::SnapshotStaging::Create(*model, at::kBFloat16).value();
  ASSERT_OK(plain->Stage(*model));
  ASSERT_OK(plain->CopyToHost());
  EXPECT_THAT(store.Publish(3, plain->HostBucketsOfCopy()),
              StatusIs(absl::StatusCode::kInvalidArgument, "plan"));
}

TEST(SnapshotPublisherTest, PublishesOffTheTrainerThreadEveryNthVersion) {
  auto model = Tiny();
  prometheus::Registry registry;
  broadcast::SnapshotStore store({}, broadcast::ModelSignatureOf(*model, at::kBFloat16), registry);
  auto publisher =
      SnapshotPublisher::Create(&store, *model, at::kBFloat16, RegisterSnapshotCounters(registry))
          .value();
  ASSERT_OK(publisher->PublishNow(0, *model));
  EXPECT_EQ(store.latest_version(), 0u);  // synchronous
  TrainerOptions every_other = Options(Objective::kAsympo);
  every_other.publish_every = 2;
  auto trainer = Trainer::Create(every_other, model.get(), publisher.get()).value();
  for (int i = 0; i < 5; ++i) ASSERT_OK(trainer->Step(FixedGroups(3)));
  publisher->Flush();
  EXPECT_EQ(store.latest_version(), 4u);  // 2 and 4 are published, 5 is not
  EXPECT_GE(publisher->coalesced(), 0);
}

TEST(SnapshotPublisherTest, ADtypeThatCannotBeBroadcastIsRefusedAtCreation) {
  auto model = Tiny();
  prometheus::Registry registry;
  broadcast::SnapshotStore store({}, broadcast::ModelSignatureOf(*model), registry);
  auto p =
      SnapshotPublisher::Create(&store, *model, at::kDouble, RegisterSnapshotCounters(registry));
  EXPECT_THAT(p.status(), StatusIs(absl::StatusCode::kInvalidArgument, "cannot be broadcast"));
}

}  // namespace
}  // namespace asympo::learner
