// BroadcastSender and WeightReceiver on the NCCL transport, in one process:
// the learner (rank 0) and the receivers are threads, NCCL and the CUDA
// runtime are fake_nccl.cc, and the control plane is a loopback gRPC server.
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "tests/testing/status_matchers.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"
#include "tests/weight_broadcaster/nccl/fake_nccl.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/nccl_snapshot.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;
using testing::ChainWeights;
using testing::ExpectWeightsOf;
using testing::LaidOut;
using testing::MetricValue;
using testing::ReceiverOptions;
using testing::SenderServer;
using testing::TestPacking;
using testing::TestSpecs;
using testing::WaitUntil;

// The fake's controls, looked up in the library the loader opens.
struct Fake {
  void (*reset)() = nullptr;
  void (*configure)(const AsympoFakeNcclConfig*) = nullptr;
  void (*stats)(AsympoFakeNcclStats*) = nullptr;

  static const Fake& Get() {
    static const Fake fake = [] {
      Fake f;
      void* handle = dlopen(ASYMPO_FAKE_NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) std::abort();
      f.reset = reinterpret_cast<void (*)()>(dlsym(handle, "asympo_fake_nccl_reset"));
      f.configure = reinterpret_cast<void (*)(const AsympoFakeNcclConfig*)>(
          dlsym(handle, "asympo_fake_nccl_configure"));
      f.stats =
          reinterpret_cast<void (*)(AsympoFakeNcclStats*)>(dlsym(handle, "asympo_fake_nccl_stats"));
      if (!f.reset || !f.configure || !f.stats) std::abort();
      return f;
    }();
    return fake;
  }
};

NcclBroadcasterOptions FakeNccl(absl::Duration timeout) {
  NcclBroadcasterOptions o;
  o.load.nccl_library = ASYMPO_FAKE_NCCL_LIBRARY;
  o.load.cudart_library = ASYMPO_FAKE_NCCL_LIBRARY;
  o.staging_bytes = 16 << 10;  // every 4 KiB test bucket is one collective
  o.timeout = timeout;
  o.init_timeout = absl::Seconds(10);
  return o;
}

testing::ServerOptions NcclSenderOptions(int world_size, absl::Duration timeout) {
  testing::ServerOptions o;
  o.packing = TestPacking();
  o.nccl_world_size = world_size;
  o.nccl = FakeNccl(timeout);
  return o;
}

// A receiver with its own registry.
struct Receiver {
  Receiver(const std::string& target, const std::string& id, bool prefer_nccl,
           absl::Duration timeout, bool deltas = true) {
    WeightReceiverOptions o = ReceiverOptions(target, id);
    o.prefer_nccl = prefer_nccl;
    o.deltas = deltas;
    o.nccl = FakeNccl(timeout);
    receiver = WeightReceiver::Start(std::move(o), registry).value();
  }

  // Waits for version `version` and takes it.
  std::shared_ptr<const ReceivedSnapshot> Await(uint64_t version) {
    std::shared_ptr<const ReceivedSnapshot> got;
    EXPECT_TRUE(WaitUntil(
        [&] {
          if (auto s = receiver->TakePending()) got = s;
          return got != nullptr && got->version() == version;
        },
        absl::Seconds(20)))
        << "version " << version << " did not arrive";
    return got != nullptr && got->version() == version ? got : nullptr;
  }
  // Waits for version `version` and checks its bytes.
  void ExpectVersion(uint64_t version) {
    std::shared_ptr<const ReceivedSnapshot> got = Await(version);
    ASSERT_NE(got, nullptr);
    ExpectWeightsOf(*got, version);
    receiver->ReportLoaded(version);
  }
  // Likewise for version `version` of the chain (ChainWeights) of `seed`.
  void ExpectChain(uint64_t version, uint64_t seed = 0) {
    std::shared_ptr<const ReceivedSnapshot> got = Await(version);
    ASSERT_NE(got, nullptr);
    const std::vector<std::string> want = ChainWeights(version, seed);
    for (int t = 0; t < got->manifest.tensors_size(); ++t) {
      EXPECT_TRUE(got->TensorBytes(got->manifest.tensors(t)) == want[static_cast<size_t>(t)])
          << "tensor " << t << " of version " << version;
    }
    receiver->ReportLoaded(version);
  }
  double FetchedBytes() { return MetricValue(registry, "asympo_rollout_weight_fetch_bytes_total"); }
  double Metric(const std::string& name) { return MetricValue(registry, name); }

  prometheus::Registry registry;
  std::unique_ptr<WeightReceiver> receiver;
};

class NcclBroadcastTest : public ::testing::Test {
 protected:
  void SetUp() override { Fake::Get().reset(); }
  void TearDown() override { Fake::Get().reset(); }

  static AsympoFakeNcclStats Stats() {
    AsympoFakeNcclStats s;
    Fake::Get().stats(&s);
    return s;
  }
};

TEST_F(NcclBroadcastTest, ReceiversThatPreferNcclGetEveryVersionOverNccl) {
  SenderServer server(NcclSenderOptions(3, absl::Seconds(20)));
  ASSERT_OK(server.Publish(1));  // before the world is full
  Receiver a(server.target(), "nccl-a", true, absl::Seconds(20));
  Receiver grpc_only(server.target(), "grpc", false, absl::Seconds(20));
  Receiver b(server.target(), "nccl-b", true, absl::Seconds(20));

  a.ExpectVersion(1);
  b.ExpectVersion(1);
  grpc_only.ExpectVersion(1);
  ASSERT_OK(server.Publish(2));
  a.ExpectVersion(2);
  b.ExpectVersion(2);
  grpc_only.ExpectVersion(2);

  EXPECT_TRUE(server.sender().nccl_active());
  // The sender counts a version once its last bucket's broadcast returns on
  // rank 0, which may be after the receivers have it.
  EXPECT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 2; }))
      << server.sender().nccl_versions_sent();
  for (Receiver* r : {&a, &b}) {
    EXPECT_TRUE(r->receiver->using_nccl());
    EXPECT_EQ(r->receiver->nccl_versions(), 2);
    EXPECT_EQ(r->receiver->failures(), 0);
    EXPECT_EQ(r->FetchedBytes(), 0) << "an NCCL receiver fetched over gRPC";
  }
  EXPECT_FALSE(grpc_only.receiver->using_nccl());
  EXPECT_GT(grpc_only.FetchedBytes(), 0);
  // Handshake plus three buckets per version, on each of the three ranks.
  EXPECT_TRUE(WaitUntil([&] { return Stats().completed == 3 * (1 + 2 * 3); })) << Stats().completed;
  const AsympoFakeNcclStats stats = Stats();
  EXPECT_EQ(stats.inits, 3);
  EXPECT_EQ(stats.count_mismatches, 0);
  EXPECT_EQ(stats.use_after_abort, 0);

  // A late joiner that prefers NCCL gets gRPC: the world is full.
  Receiver late(server.target(), "late", true, absl::Seconds(20));
  late.ExpectVersion(2);
  EXPECT_FALSE(late.receiver->using_nccl());
  EXPECT_GT(late.FetchedBytes(), 0);
}

TEST_F(NcclBroadcastTest, BucketsGivenInDeviceMemoryAreBroadcastFromThere) {
  SenderServer server(NcclSenderOptions(2, absl::Seconds(20)));
  EXPECT_TRUE(server.sender().nccl_configured());
  Receiver a(server.target(), "nccl-a", true, absl::Seconds(20));
  ASSERT_OK(server.Publish(1));
  a.ExpectVersion(1);
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 1; }));
  const int64_t staged_before = Stats().host_to_device_copies;
  EXPECT_GT(staged_before, 0) << "host buckets go through the device staging";

  // Version 2's buckets in host memory and also "in device memory" (the
  // fake's device memory is host memory), both laid out as the store's plan
  // says.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const SnapshotPlan> plan, server.store().Plan(TestSpecs()));
  HostBuckets host = LaidOut(plan, 2);
  const HostBuckets on_device = LaidOut(plan, 2);
  DeviceBuckets device;
  device.data = on_device.data;
  device.keep_alive = on_device.keep_alive;
  ASSERT_OK(server.store().Publish(2, std::move(host), &device));
  a.ExpectVersion(2);
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 2; }));
  EXPECT_EQ(Stats().host_to_device_copies, staged_before)
      << "version 2 went through the host staging instead of straight from the device";
  EXPECT_EQ(Stats().count_mismatches, 0);
}

TEST_F(NcclBroadcastTest, AHungBroadcastFallsBackToGrpcForEveryone) {
  AsympoFakeNcclConfig config;
  config.hang_from_broadcast = 4;  // handshake and version 1 (three buckets) complete
  Fake::Get().configure(&config);
  SenderServer server(NcclSenderOptions(3, absl::Milliseconds(300)));
  Receiver a(server.target(), "nccl-a", true, absl::Milliseconds(300));
  Receiver b(server.target(), "nccl-b", true, absl::Milliseconds(300));
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_active(); }, absl::Seconds(20)));
  ASSERT_OK(server.Publish(1));
  a.ExpectVersion(1);
  b.ExpectVersion(1);
  EXPECT_EQ(a.FetchedBytes(), 0);

  // Version 2 hangs: every rank's watchdog aborts, and it comes over gRPC.
  ASSERT_OK(server.Publish(2));
  a.ExpectVersion(2);
  b.ExpectVersion(2);
  EXPECT_FALSE(server.sender().nccl_active());
  EXPECT_GE(server.Metric("asympo_broadcast_failures_total"), 1);
  for (Receiver* r : {&a, &b}) {
    EXPECT_FALSE(r->receiver->using_nccl());
    EXPECT_EQ(r->receiver->failures(), 1);
    EXPECT_GT(r->FetchedBytes(), 0);
  }
  ASSERT_OK(server.Publish(3));
  a.ExpectVersion(3);
  b.ExpectVersion(3);
  EXPECT_EQ(server.sender().nccl_versions_sent(), 1);
  EXPECT_GE(Stats().aborts, 3);
  EXPECT_EQ(Stats().use_after_abort, 0);
}

// An NCCL sender whose store keeps deltas (a keyframe every
// `keyframe_every` versions).
testing::ServerOptions NcclDeltaOptions(int world_size, int keyframe_every) {
  testing::ServerOptions o = NcclSenderOptions(world_size, absl::Seconds(20));
  o.delta_keyframe_every = keyframe_every;
  o.incarnation = "learner-1";  // deltas stay within one incarnation
  return o;
}

absl::Status PublishChain(SenderServer& server, uint64_t version, uint64_t seed = 0) {
  const std::vector<std::string> w = ChainWeights(version, seed);
  return server.store().Publish(version, testing::Views(w));
}

TEST_F(NcclBroadcastTest, RanksRebuildAChainOfDeltaVersionsBitExact) {
  SenderServer server(NcclDeltaOptions(3, 4));
  Receiver a(server.target(), "nccl-a", true, absl::Seconds(20));
  Receiver b(server.target(), "nccl-b", true, absl::Seconds(20));
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_active(); }, absl::Seconds(20)));
  double whole_bytes = 0;
  for (uint64_t v = 1; v <= 8; ++v) {
    ASSERT_OK(PublishChain(server, v));
    whole_bytes += static_cast<double>(server.store().latest()->manifest().total_bytes());
    a.ExpectChain(v);
    b.ExpectChain(v);
  }
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 8; }));
  // 1 and 5 are keyframes; every other version's delta is from the one
  // broadcast before it.
  EXPECT_EQ(server.sender().nccl_delta_versions_sent(), 6);
  EXPECT_EQ(server.Metric("asympo_broadcast_nccl_delta_versions_total"), 6);
  EXPECT_LT(server.Metric("asympo_broadcast_nccl_bytes_total"), 0.5 * whole_bytes);
  for (Receiver* r : {&a, &b}) {
    EXPECT_TRUE(r->receiver->using_nccl());
    EXPECT_EQ(r->Metric("asympo_rollout_weight_delta_versions_total"), 6);
    EXPECT_EQ(r->Metric("asympo_rollout_weight_delta_fallbacks_total"), 0);
    EXPECT_EQ(r->receiver->failures(), 0);
    EXPECT_EQ(r->FetchedBytes(), 0) << "an NCCL receiver fetched over gRPC";
  }
  EXPECT_EQ(Stats().count_mismatches, 0) << "the ranks disagreed on a broadcast's size";
}

TEST_F(NcclBroadcastTest, ACorruptNcclDeltaIsFetchedWholeOverGrpcAndTheCommunicatorStays) {
  testing::ServerOptions o = NcclDeltaOptions(2, 100);
  o.corrupt_delta_versions = {3};
  SenderServer server(o);
  Receiver a(server.target(), "nccl-a", true, absl::Seconds(20));
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_active(); }, absl::Seconds(20)));
  for (uint64_t v = 1; v <= 4; ++v) {
    ASSERT_OK(PublishChain(server, v));
    a.ExpectChain(v);
  }
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_fallbacks_total"), 1);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_versions_total"), 2);  // 2 and 4
  EXPECT_EQ(a.receiver->failures(), 0);                                  // version 3 arrived, whole
  EXPECT_GT(a.FetchedBytes(), 0);                                        // over gRPC
  EXPECT_TRUE(a.receiver->using_nccl());
  EXPECT_EQ(a.receiver->nccl_versions(), 4);
  EXPECT_EQ(Stats().count_mismatches, 0);
}

// Versions published faster than the loop broadcasts: version 2's broadcast
// is held in the collective until 3 and 4 are published, so 3 is never
// broadcast and 4's delta (from 3) does not fit what the ranks hold (2).
TEST_F(NcclBroadcastTest, AVersionPublishedDuringABroadcastIsSkippedAndTheNextGoesWhole) {
  SenderServer server(NcclDeltaOptions(2, 100));
  Receiver a(server.target(), "nccl-a", true, absl::Seconds(20));
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_active(); }, absl::Seconds(20)));
  ASSERT_OK(PublishChain(server, 1));
  a.ExpectChain(1);
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 1; }));
  AsympoFakeNcclConfig held;
  held.hang_from_broadcast = 0;  // every broadcast from now on waits
  Fake::Get().configure(&held);
  const int64_t enqueued = Stats().enqueued;
  ASSERT_OK(PublishChain(server, 2));
  ASSERT_TRUE(WaitUntil([&] { return Stats().enqueued > enqueued; }))
      << "version 2's broadcast did not start";
  ASSERT_OK(PublishChain(server, 3));
  ASSERT_OK(PublishChain(server, 4));
  AsympoFakeNcclConfig released;
  Fake::Get().configure(&released);
  a.ExpectChain(4);
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 3; }));
  EXPECT_EQ(server.sender().nccl_delta_versions_sent(), 1);  // 2 only: 4 went whole
  ASSERT_OK(PublishChain(server, 5));
  a.ExpectChain(5);
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_delta_versions_sent() == 2; }))
      << "5's delta, from 4, fits again";
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_versions_total"), 2);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_fallbacks_total"), 0);
  EXPECT_EQ(a.FetchedBytes(), 0);
  EXPECT_EQ(Stats().count_mismatches, 0);
}

// A learner restarted from an older checkpoint: its versions are another
// incarnation's, other weights under numbers the ranks have seen. Its first
// goes whole over the new communicator, the next as a delta of its own.
TEST_F(NcclBroadcastTest, ARestartedLearnersFirstVersionGoesWholeThenItsOwnDeltas) {
  auto first = std::make_unique<SenderServer>(NcclDeltaOptions(2, 100));
  const int port = first->port();
  Receiver a(first->target(), "nccl-a", true, absl::Seconds(20));
  ASSERT_TRUE(WaitUntil([&] { return first->sender().nccl_active(); }, absl::Seconds(20)));
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_OK(PublishChain(*first, v));
    a.ExpectChain(v);
  }
  first->sender().Shutdown();
  ASSERT_TRUE(WaitUntil([&] { return !a.receiver->connected(); }));
  first.reset();

  testing::ServerOptions o = NcclDeltaOptions(2, 100);
  o.incarnation = "learner-2";
  SenderServer second(o, port);
  ASSERT_EQ(second.port(), port);
  ASSERT_TRUE(WaitUntil([&] { return second.sender().nccl_active(); }, absl::Seconds(20)));
  ASSERT_OK(PublishChain(second, 2, /*seed=*/1));
  a.ExpectChain(2, 1);
  ASSERT_OK(PublishChain(second, 3, 1));
  a.ExpectChain(3, 1);
  ASSERT_TRUE(WaitUntil([&] { return second.sender().nccl_versions_sent() == 2; }));
  EXPECT_EQ(second.sender().nccl_delta_versions_sent(), 1);              // 3, from the new 2
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_versions_total"), 3);  // 2 and 3, then 3
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_fallbacks_total"), 0);
  EXPECT_EQ(a.receiver->failures(), 0);
  EXPECT_EQ(a.FetchedBytes(), 0) << "a version came over gRPC";
  EXPECT_EQ(Stats().count_mismatches, 0);
}

TEST_F(NcclBroadcastTest, OneRankWithoutDeltasMakesEveryBroadcastWhole) {
  SenderServer server(NcclDeltaOptions(3, 100));
  Receiver a(server.target(), "nccl-a", true, absl::Seconds(20));
  Receiver whole(server.target(), "nccl-whole", true, absl::Seconds(20), /*deltas=*/false);
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_active(); }, absl::Seconds(20)));
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_OK(PublishChain(server, v));
    a.ExpectChain(v);
    whole.ExpectChain(v);
  }
  ASSERT_TRUE(WaitUntil([&] { return server.sender().nccl_versions_sent() == 3; }));
  EXPECT_EQ(server.sender().nccl_delta_versions_sent(), 0);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_versions_total"), 0);
  EXPECT_EQ(Stats().count_mismatches, 0);
}

TEST_F(NcclBroadcastTest, ADeltaWithoutItsBaseOrWithBadSizesIsRefused) {
  // Two versions of the chain, the second with its delta from the first.
  SenderServer server(NcclDeltaOptions(2, 100));
  ASSERT_OK(PublishChain(server, 1));
  ASSERT_OK(PublishChain(server, 2));
  const std::shared_ptr<const Snapshot> s = server.store().latest();
  ASSERT_NE(s->delta, nullptr);
  v1::SnapshotAnnouncement a = *s->announcement;
  for (const std::string& d : s->delta->buckets) a.add_nccl_delta_bytes(d.size());

  // Sizes that do not fit the manifest: refused before any collective.
  const NcclBroadcasterOptions options = FakeNccl(absl::Seconds(10));
  const std::string id = NewNcclUniqueId(options.load).value();
  std::unique_ptr<NcclBroadcaster> root;
  std::thread root_thread([&] {
    root = NcclBroadcaster::Create(id, 0, 2, 0, options).value();
    for (int b = 0; b < s->manifest().buckets_size(); ++b) {
      const std::string& d = s->delta->buckets[static_cast<size_t>(b)];
      if (s->manifest().buckets(b).size_bytes() == 0) continue;
      std::string bytes =
          d.empty() ? std::string(s->bucket(b), s->manifest().buckets(b).size_bytes()) : d;
      ASSERT_OK(root->Broadcast(bytes.data(), bytes.size()));
    }
  });
  std::unique_ptr<NcclBroadcaster> rank1 = NcclBroadcaster::Create(id, 1, 2, 0, options).value();
  const std::string signature = s->manifest().model_signature();
  bool delta_failed = false;
  v1::SnapshotAnnouncement short_sizes = a;
  short_sizes.mutable_nccl_delta_bytes()->RemoveLast();
  EXPECT_THAT(ReceiveSnapshotOverNccl(*rank1, short_sizes, signature, nullptr, &delta_failed),
              StatusIs(absl::StatusCode::kInvalidArgument, "entries for"));
  v1::SnapshotAnnouncement too_long = a;
  too_long.set_nccl_delta_bytes(0, 1 << 20);
  EXPECT_THAT(ReceiveSnapshotOverNccl(*rank1, too_long, signature, nullptr, &delta_failed),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds"));
  EXPECT_FALSE(delta_failed);

  // Without the base: every broadcast taken part in, then refused.
  EXPECT_THAT(ReceiveSnapshotOverNccl(*rank1, a, signature, nullptr, &delta_failed),
              StatusIs(absl::StatusCode::kFailedPrecondition, "does not hold"));
  EXPECT_TRUE(delta_failed);
  root_thread.join();
  EXPECT_EQ(Stats().count_mismatches, 0);
  EXPECT_TRUE(rank1->healthy());
}

TEST_F(NcclBroadcastTest, WithoutNcclLibrariesTheSenderStaysOnGrpc) {
  testing::ServerOptions o = NcclSenderOptions(2, absl::Seconds(5));
  o.nccl.load.nccl_library = "/nonexistent/libnccl.so.2";
  SenderServer server(o);
  Receiver a(server.target(), "a", true, absl::Seconds(5));
  ASSERT_OK(server.Publish(1));
  a.ExpectVersion(1);
  EXPECT_FALSE(a.receiver->using_nccl());
  EXPECT_FALSE(server.sender().nccl_active());
  EXPECT_GT(a.FetchedBytes(), 0);
}

}  // namespace
}  // namespace asympo::broadcast
