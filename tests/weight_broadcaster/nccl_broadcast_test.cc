// BroadcastSender and WeightReceiver on the NCCL transport, in one process:
// the learner (rank 0) and the receivers are threads, NCCL and the CUDA
// runtime are fake_nccl.cc, and the control plane is a loopback gRPC server.
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "tests/testing/status_matchers.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"
#include "tests/weight_broadcaster/nccl/fake_nccl.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace asympo::broadcast {
namespace {

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
           absl::Duration timeout) {
    WeightReceiverOptions o = ReceiverOptions(target, id);
    o.prefer_nccl = prefer_nccl;
    o.nccl = FakeNccl(timeout);
    receiver = WeightReceiver::Start(std::move(o), registry).value();
  }

  // Waits for version `version` and checks its bytes.
  void ExpectVersion(uint64_t version) {
    std::shared_ptr<const ReceivedSnapshot> got;
    ASSERT_TRUE(WaitUntil(
        [&] {
          if (auto s = receiver->TakePending()) got = s;
          return got != nullptr && got->version() == version;
        },
        absl::Seconds(20)))
        << "version " << version << " did not arrive";
    ExpectWeightsOf(*got, version);
    receiver->ReportLoaded(version);
  }
  double FetchedBytes() { return MetricValue(registry, "asympo_rollout_weight_fetch_bytes_total"); }

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
