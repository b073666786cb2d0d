// A model's versions through the broadcaster, model to model: a learner's
// model with low-rank adapters staged (SnapshotStaging, bfloat16) and
// published, received over NCCL (fake_nccl.cc, a CPU stand-in for libnccl
// and libcudart) and over gRPC, and loaded into a rollout's model
// (LoadSnapshotIntoModel): both paths rebuild the learner's merged weights.
#include "weight_broadcaster/model_weights/model_snapshot.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <torch/types.h>

#include "tests/testing/status_matchers.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace asympo::broadcast {
namespace {

std::unique_ptr<PolicyModel> LoraModel(at::ScalarType dtype) {
  ModelOptions o;
  o.seed = 21;
  o.dtype = dtype;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.targets = kAllLoraTargets;
  return PolicyModel::CreateRandom(ModelConfig::Tiny(64), o).value();
}

NcclBroadcasterOptions FakeNccl() {
  NcclBroadcasterOptions o;
  o.load.nccl_library = ASYMPO_FAKE_NCCL_LIBRARY;
  o.load.cudart_library = ASYMPO_FAKE_NCCL_LIBRARY;
  o.timeout = absl::Seconds(20);
  o.init_timeout = absl::Seconds(10);
  return o;
}

std::shared_ptr<const ReceivedSnapshot> Await(WeightReceiver& r, uint64_t version) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (auto s = r.TakePending(); s != nullptr && s->version() == version) return s;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return nullptr;
}

TEST(ModelSnapshotTest, AdaptersOverNcclAndGrpcRebuildTheLearnersMergedWeights) {
  // The learner: float32 master adapters, versions in bfloat16.
  const auto learner = LoraModel(at::kFloat);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : learner->named_parameters()) t.normal_(0.0, 0.1);
  }
  prometheus::Registry registry;
  SnapshotStore store({}, ModelSignatureOf(*learner, at::kBFloat16), registry);
  BroadcastSenderOptions so;
  so.nccl_world_size = 2;
  so.nccl = FakeNccl();
  BroadcastSender sender(so, store, registry);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&sender);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();

  auto staging = SnapshotStaging::Create(*learner, at::kBFloat16, store, false).value();
  ASSERT_OK(staging->Stage(*learner));
  ASSERT_OK(staging->CopyToHost().status());
  ASSERT_OK(store.Publish(1, staging->HostBucketsOfCopy()));

  // Two rollouts in bfloat16: one prefers NCCL, one takes gRPC.
  for (const bool nccl : {true, false}) {
    SCOPED_TRACE(nccl ? "NCCL" : "gRPC");
    const auto rollout = LoraModel(at::kBFloat16);
    prometheus::Registry rx_registry;
    WeightReceiverOptions ro;
    ro.target = "127.0.0.1:" + std::to_string(port);
    ro.receiver_id = nccl ? "nccl" : "grpc";
    ro.model_signature = ModelSignatureOf(*rollout);
    ro.prefer_nccl = nccl;
    ro.nccl = FakeNccl();
    ro.min_backoff = absl::Milliseconds(10);
    ro.max_backoff = absl::Milliseconds(100);
    auto receiver = WeightReceiver::Start(std::move(ro), rx_registry).value();
    const std::shared_ptr<const ReceivedSnapshot> got = Await(*receiver, 1);
    ASSERT_NE(got, nullptr) << "version 1 did not arrive";
    EXPECT_EQ(receiver->using_nccl(), nccl);
    ASSERT_OK(LoadSnapshotIntoModel(*got, rollout.get()));
    receiver->ReportLoaded(1);
    // The adapters are the learner's in bfloat16, and the merged weights are
    // what the learner's adapters in bfloat16 merge to.
    for (size_t i = 0; i < learner->named_parameters().size(); ++i) {
      const auto& [name, t] = learner->named_parameters()[i];
      EXPECT_TRUE(torch::equal(rollout->named_parameters()[i].second,
                               t.detach().to(torch::kBFloat16).to(torch::kFloat)))
          << name;
    }
    const auto reference = LoraModel(at::kBFloat16);  // the same base
    std::vector<std::pair<std::string, at::Tensor>> sent;
    for (const auto& [name, t] : learner->named_parameters()) {
      sent.emplace_back(name, t.detach().to(torch::kBFloat16));
    }
    ASSERT_OK(reference->LoadParameters(sent));
    const auto mine = rollout->MergedWeights(), theirs = reference->MergedWeights();
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_TRUE(torch::equal(mine[i].second, theirs[i].second)) << mine[i].first;
    }
    receiver.reset();
  }
  sender.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace asympo::broadcast
