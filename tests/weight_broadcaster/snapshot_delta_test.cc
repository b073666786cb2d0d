// Delta versions end to end: the store's deltas and keyframes, and
// receivers on a real loopback gRPC server rebuilding every version
// bit-exact from the one they hold, falling back to the whole version when
// a delta is corrupt, and taking it whole when they lack the base.
#include "weight_broadcaster/snapshot_delta.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/crc32c.h"
#include "tests/testing/status_matchers.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"
#include "weight_broadcaster/delta_codec.h"
#include "weight_broadcaster/snapshot_fetch.h"

namespace asympo::broadcast {
namespace {

using testing::ChainWeights;
using testing::MetricValue;
using testing::ReceiverOptions;
using testing::SenderServer;
using testing::WaitUntil;

testing::ServerOptions DeltaServer(int keyframe_every) {
  testing::ServerOptions o;
  o.packing = testing::TestPacking();
  o.delta_keyframe_every = keyframe_every;
  o.incarnation = "learner-1";  // deltas stay within one incarnation (none: no deltas)
  return o;
}

struct DeltaRx {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<WeightReceiver> receiver;

  explicit DeltaRx(WeightReceiverOptions o) {
    receiver = *WeightReceiver::Start(std::move(o), *registry);
  }
  WeightReceiver* operator->() { return receiver.get(); }
  double Metric(const std::string& name) { return MetricValue(*registry, name); }
  // Waits for `version` and checks that its bytes are `want`'s, then loads it.
  void ExpectAndLoad(uint64_t version, const std::vector<std::string>& want) {
    ASSERT_TRUE(receiver->WaitForPending(absl::Seconds(3))) << "no version " << version;
    std::shared_ptr<const ReceivedSnapshot> s = receiver->TakePending();
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(s->version(), version);
    ASSERT_EQ(s->manifest.tensors_size(), static_cast<int>(want.size()));
    for (int t = 0; t < s->manifest.tensors_size(); ++t) {
      EXPECT_TRUE(s->TensorBytes(s->manifest.tensors(t)) == want[static_cast<size_t>(t)])
          << "tensor " << t << " of version " << version;
    }
    receiver->ReportLoaded(version);
  }
};

absl::Status Publish(SenderServer& server, uint64_t version, uint64_t seed = 0) {
  const std::vector<std::string> w = ChainWeights(version, seed);
  return server.store().Publish(version, testing::Views(w));
}

TEST(SnapshotDeltaTest, TheStoreHoldsADeltaFromTheVersionBeforeExceptAtKeyframes) {
  SenderServer server(DeltaServer(3));
  std::vector<bool> has_delta;
  for (uint64_t v = 1; v <= 7; ++v) {
    ASSERT_OK(Publish(server, v));
    std::shared_ptr<const Snapshot> s = server.store().latest();
    has_delta.push_back(s->manifest().has_delta_base());
    EXPECT_EQ(s->delta != nullptr, s->manifest().has_delta_base());
    if (s->delta == nullptr) {
      EXPECT_EQ(server.Metric("asympo_broadcast_delta_bytes"), 0);
      continue;
    }
    EXPECT_EQ(s->manifest().delta_base_version(), v - 1);
    EXPECT_EQ(s->delta->base_version, v - 1);
    EXPECT_LT(s->delta->bytes, s->manifest().total_bytes() / 4) << "about 2% of the words changed";
    EXPECT_EQ(server.Metric("asympo_broadcast_delta_bytes"), s->delta->bytes);
  }
  EXPECT_EQ(has_delta, (std::vector<bool>{false, true, true, false, true, true, false}));
}

TEST(SnapshotDeltaTest, AVersionThatChangedEverywhereHasNoDelta) {
  SenderServer server(DeltaServer(100));
  ASSERT_OK(server.Publish(1));  // testing::Weights: every byte differs between versions
  ASSERT_OK(server.Publish(2));
  std::shared_ptr<const Snapshot> s = server.store().latest();
  EXPECT_EQ(s->delta, nullptr);
  EXPECT_FALSE(s->manifest().has_delta_base());
  EXPECT_EQ(server.Metric("asympo_broadcast_delta_bytes"), 0);
  // Its CRCs were taken all the same.
  const v1::SnapshotManifest& m = s->manifest();
  for (int b = 0; b < m.buckets_size(); ++b) {
    EXPECT_EQ(m.buckets(b).crc32c(), Crc32c(s->bucket(b), m.buckets(b).size_bytes())) << b;
  }
}

TEST(SnapshotDeltaTest, ABucketWhereMoreThanAQuarterChangedTravelsWhole) {
  // A bucket of 3 MiB: the first MiB (sampled) has 30% of its words
  // changed; the rest, 1%: the estimate sees 30%, so no delta is encoded.
  const size_t bytes = size_t{3} << 20;
  std::vector<TensorSpec> specs = {{"w", v1::DTYPE_BF16, {static_cast<int64_t>(bytes / 2)}}};
  v1::SnapshotManifest m = *PlanSnapshot(specs, 1, PackingOptions{});
  std::string a(bytes, '\0'), b = a;
  for (size_t i = 0; i < bytes; i += 2) {
    if ((i < (size_t{1} << 20) && i % 20 < 6) || i % 200 == 0) b[i] = 1;
  }
  std::vector<uint32_t> crcs;
  auto delta = EncodeSnapshotDelta(m, {a.data()}, {b.data()}, 0, 2, &crcs);
  ASSERT_OK(delta);
  EXPECT_TRUE((*delta)->buckets[0].empty());
  EXPECT_EQ(crcs[0], Crc32c(b.data(), b.size()));
  // Below the quarter: a delta, and the same CRC.
  for (size_t i = 0; i < (size_t{1} << 20); i += 2) b[i] = i % 200 == 0 ? 1 : 0;
  delta = EncodeSnapshotDelta(m, {a.data()}, {b.data()}, 0, 2, &crcs);
  ASSERT_OK(delta);
  EXPECT_FALSE((*delta)->buckets[0].empty());
  EXPECT_LT((*delta)->bytes, bytes / 50);
  EXPECT_EQ(crcs[0], Crc32c(b.data(), b.size()));
}

TEST(SnapshotDeltaTest, CountChangedWordsCountsEveryWordSize) {
  std::string a(1000, 'x'), b = a;
  for (size_t i : {0, 3, 17, 500, 999}) b[i] = 'y';
  EXPECT_EQ(CountChangedWords(reinterpret_cast<const uint8_t*>(a.data()),
                              reinterpret_cast<const uint8_t*>(b.data()), 1000, 1),
            5u);
  EXPECT_EQ(CountChangedWords(reinterpret_cast<const uint8_t*>(a.data()),
                              reinterpret_cast<const uint8_t*>(b.data()), 1000, 2),
            5u);
  EXPECT_EQ(CountChangedWords(reinterpret_cast<const uint8_t*>(a.data()),
                              reinterpret_cast<const uint8_t*>(b.data()), 1000, 4),
            4u);  // 0 and 3
  EXPECT_EQ(CountChangedWords(reinterpret_cast<const uint8_t*>(a.data()),
                              reinterpret_cast<const uint8_t*>(b.data()), 1000, 8),
            4u);
}

TEST(SnapshotDeltaTest, TwoReceiversRebuildAChainOfVersionsBitExact) {
  SenderServer server(DeltaServer(4));
  DeltaRx a(ReceiverOptions(server.target(), "rollout-0"));
  DeltaRx b(ReceiverOptions(server.target(), "rollout-1"));
  ASSERT_TRUE(WaitUntil([&] { return a->connected() && b->connected(); }));
  double full = 0, deltas = 0;
  for (uint64_t v = 1; v <= 12; ++v) {
    ASSERT_OK(Publish(server, v));
    std::shared_ptr<const Snapshot> s = server.store().latest();
    (s->delta != nullptr ? deltas : full) += 1;
    a.ExpectAndLoad(v, ChainWeights(v, 0));
    b.ExpectAndLoad(v, ChainWeights(v, 0));
  }
  EXPECT_EQ(full, 3);  // 1, 5 and 9
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_versions_total"), deltas);
  EXPECT_EQ(b.Metric("asympo_rollout_weight_delta_versions_total"), deltas);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_fallbacks_total"), 0);
  EXPECT_EQ(a->failures(), 0);
  const double total = static_cast<double>(server.store().latest()->manifest().total_bytes());
  EXPECT_LT(a.Metric("asympo_rollout_weight_fetch_bytes_total"), (full + deltas / 4) * total);
}

TEST(SnapshotDeltaTest, ACorruptDeltaIsFetchedWholeAndCounted) {
  testing::ServerOptions o = DeltaServer(100);
  o.corrupt_delta_versions = {3};
  SenderServer server(o);
  DeltaRx a(ReceiverOptions(server.target(), "rollout-0"));
  ASSERT_TRUE(WaitUntil([&] { return a->connected(); }));
  for (uint64_t v = 1; v <= 4; ++v) {
    ASSERT_OK(Publish(server, v));
    a.ExpectAndLoad(v, ChainWeights(v, 0));
  }
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_fallbacks_total"), 1);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_delta_versions_total"), 2);  // 2 and 4
  EXPECT_EQ(a->failures(), 0);  // the version arrived, whole
}

TEST(SnapshotDeltaTest, AReceiverWithoutTheBaseGetsTheVersionWhole) {
  testing::ServerOptions o = DeltaServer(100);
  o.default_chunk_bytes = 512;
  o.chunk_delay = absl::Milliseconds(15);  // each whole fetch takes ~0.3 s
  SenderServer server(o);
  DeltaRx slow(ReceiverOptions(server.target(), "slow"));
  ASSERT_TRUE(WaitUntil([&] { return slow->connected(); }));
  ASSERT_OK(Publish(server, 1));
  ASSERT_TRUE(WaitUntil([&] { return server.Metric("asympo_broadcast_bytes_total") > 0; }));
  for (uint64_t v : {2, 3}) ASSERT_OK(Publish(server, v));  // while 1 is in flight
  // It holds 1; 3's delta is from 2, which it missed.
  ASSERT_TRUE(WaitUntil([&] { return slow.Metric("asympo_rollout_weight_fetch_seconds") == 2; },
                        absl::Seconds(5)));
  slow.ExpectAndLoad(3, ChainWeights(3, 0));
  EXPECT_EQ(slow.Metric("asympo_rollout_weight_delta_versions_total"), 0);
  ASSERT_OK(Publish(server, 4));
  slow.ExpectAndLoad(4, ChainWeights(4, 0));
  EXPECT_EQ(slow.Metric("asympo_rollout_weight_delta_versions_total"), 1);

  // A late joiner holds nothing: whole, then deltas.
  DeltaRx late(ReceiverOptions(server.target(), "late"));
  late.ExpectAndLoad(4, ChainWeights(4, 0));
  ASSERT_OK(Publish(server, 5));
  late.ExpectAndLoad(5, ChainWeights(5, 0));
  EXPECT_EQ(late.Metric("asympo_rollout_weight_delta_versions_total"), 1);

  // A receiver that keeps no base never asks for a delta.
  WeightReceiverOptions plain = ReceiverOptions(server.target(), "plain");
  plain.deltas = false;
  DeltaRx whole(plain);
  whole.ExpectAndLoad(5, ChainWeights(5, 0));
  ASSERT_OK(Publish(server, 6));
  whole.ExpectAndLoad(6, ChainWeights(6, 0));
  EXPECT_EQ(whole.Metric("asympo_rollout_weight_delta_versions_total"), 0);
}

TEST(SnapshotDeltaTest, ARestartedLearnersVersionsAreNeverRebuiltFromTheOldOnes) {
  testing::ServerOptions o = DeltaServer(100);
  o.incarnation = "first";
  auto server = std::make_unique<SenderServer>(o);
  DeltaRx rx(ReceiverOptions(server->target(), "rollout-0"));
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_OK(Publish(*server, v));
    rx.ExpectAndLoad(v, ChainWeights(v, 0));
  }
  const int port = server->port();
  server->sender().Shutdown();
  ASSERT_TRUE(WaitUntil([&] { return !rx->connected(); }));
  server.reset();
  o.incarnation = "second";
  server = std::make_unique<SenderServer>(o, port);
  // Other weights (seed 1) from version 2 on: 3 is a delta from this
  // incarnation's 2, never from the 3 or 2 of the first.
  for (uint64_t v = 2; v <= 4; ++v) {
    ASSERT_OK(Publish(*server, v, 1));
    rx.ExpectAndLoad(v, ChainWeights(v, 1));
  }
  EXPECT_EQ(rx.Metric("asympo_rollout_weight_delta_versions_total"), 2 + 2);
  EXPECT_EQ(rx.Metric("asympo_rollout_weight_delta_fallbacks_total"), 0);
}

TEST(SnapshotDeltaTest, ABaseIsUsedOnlyForTheManifestsDeltaBase) {
  const v1::SnapshotManifest m = *PlanSnapshot(testing::TestSpecs(), 3, testing::TestPacking());
  ReceivedSnapshot base;
  base.manifest = m;
  base.manifest.set_version(2);
  base.manifest.set_incarnation("x");
  for (const v1::BucketInfo& b : m.buckets()) base.buckets.emplace_back(b.size_bytes(), '\0');
  v1::SnapshotManifest next = m;
  next.set_incarnation("x");
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, &base), nullptr) << "no delta base";
  next.set_has_delta_base(true);
  next.set_delta_base_version(2);
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, &base), &base);
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, nullptr), nullptr);
  next.set_delta_base_version(1);
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, &base), nullptr) << "another version";
  next.set_delta_base_version(2);
  next.set_incarnation("y");
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, &base), nullptr) << "another incarnation";
  next.set_incarnation("");
  base.manifest.set_incarnation("");
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, &base), nullptr) << "an unknown incarnation";
  next.set_incarnation("x");
  base.manifest.set_incarnation("x");
  base.buckets[0].push_back('\0');
  EXPECT_EQ(SnapshotFetcher::DeltaBaseFor(next, &base), nullptr) << "another layout";
}

TEST(SnapshotDeltaTest, WordsFollowTheBucketsSmallestElement) {
  const v1::SnapshotManifest m = *PlanSnapshot(testing::TestSpecs(), 3, testing::TestPacking());
  ASSERT_EQ(m.buckets_size(), 3);
  EXPECT_EQ(DeltaWordBytes(m, 0), 4);  // the float32 embedding alone
  EXPECT_EQ(DeltaWordBytes(m, 1), 2);  // bfloat16 and float16
}

}  // namespace
}  // namespace asympo::broadcast
