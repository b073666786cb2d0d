// BroadcastSender and WeightReceiver end to end: a real gRPC server on a
// loopback port, receivers with their own channels.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/crc32c.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/log_lines.h"
#include "tests/testing/status_matchers.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using testing::ExpectWeightsOf;
using ::testing::HasSubstr;
using testing::MetricValue;
using ::testing::Not;
using ::testing::Pair;
using testing::ReceiverOptions;
using testing::SenderServer;
using testing::WaitUntil;

testing::ServerOptions SmallBuckets() {
  testing::ServerOptions o;
  o.packing = testing::TestPacking();
  return o;
}

struct Rx {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<WeightReceiver> receiver;

  Rx(WeightReceiverOptions o) { receiver = *WeightReceiver::Start(std::move(o), *registry); }
  WeightReceiver* operator->() { return receiver.get(); }
  double Metric(const std::string& name) { return MetricValue(*registry, name); }
  // Waits for a pending snapshot of `version`, checks its bytes and loads it.
  void ExpectAndLoad(uint64_t version) {
    ASSERT_TRUE(receiver->WaitForPending(absl::Seconds(2))) << "no version " << version;
    std::shared_ptr<const ReceivedSnapshot> s = receiver->TakePending();
    ASSERT_NE(s, nullptr);
    ExpectWeightsOf(*s, version);
    receiver->ReportLoaded(version);
  }
};

TEST(BroadcastTest, TwoReceiversGetEveryVersionByteExact) {
  SenderServer server(SmallBuckets());
  Rx a(ReceiverOptions(server.target(), "rollout-0"));
  Rx b(ReceiverOptions(server.target(), "rollout-1"));
  ASSERT_TRUE(WaitUntil([&] { return a->connected() && b->connected(); }));
  EXPECT_TRUE(WaitUntil([&] { return server.sender().active_receivers() == 2; }))
      << server.sender().active_receivers();

  for (uint64_t v : {1, 2}) {
    ASSERT_OK(server.Publish(v));
    a.ExpectAndLoad(v);
    b.ExpectAndLoad(v);
  }
  ASSERT_TRUE(WaitUntil([&] {
    return server.sender().receiver_versions() ==
           std::vector<std::pair<std::string, uint64_t>>{{"rollout-0", 2}, {"rollout-1", 2}};
  }));
  EXPECT_EQ(a->latest_announced(), 2u);
  EXPECT_EQ(a->failures(), 0);

  const v1::SnapshotManifest m = *PlanSnapshot(testing::TestSpecs(), 2, testing::TestPacking());
  ASSERT_EQ(m.buckets_size(), 3);  // the test model does span buckets
  EXPECT_EQ(server.Metric("asympo_broadcast_version"), 2);
  EXPECT_EQ(server.Metric("asympo_broadcast_bytes_total"), 4.0 * m.total_bytes());
  EXPECT_EQ(server.Metric("asympo_broadcast_publish_seconds"), 2);
  EXPECT_EQ(server.Metric("asympo_broadcast_transfer_seconds"), 4);
  EXPECT_EQ(server.Metric("asympo_broadcast_failures_total"), 0);
  EXPECT_EQ(server.Metric("asympo_broadcast_receivers"), 2);
  EXPECT_EQ(server.Metric("asympo_broadcast_versions_in_use"), 1);
  EXPECT_EQ(server.Metric("asympo_broadcast_oldest_receiver_version"), 2);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_version"), 2);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_connected"), 1);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_fetch_seconds"), 2);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_fetch_bytes_total"), 2.0 * m.total_bytes());
  EXPECT_EQ(a.Metric("asympo_rollout_weight_failures_total"), 0);
}

// The labels of the one series of info gauge `name` (empty: none, or more
// than one).
std::map<std::string, std::string> InfoLabels(prometheus::Registry& r, const std::string& name) {
  std::map<std::string, std::string> out;
  for (const prometheus::MetricFamily& f : r.Collect()) {
    if (f.name != name || f.metric.size() != 1) continue;
    for (const prometheus::ClientMetric::Label& l : f.metric[0].label) out[l.name] = l.value;
  }
  return out;
}

// Anyone can check from outside that a rollout holds the learner's bytes:
// the digest it samples with is the one the learner published for that
// version, and other bytes have another.
TEST(BroadcastTest, ARolloutsWeightsDigestIsTheOneTheLearnerPublished) {
  SenderServer server(SmallBuckets());
  Rx a(ReceiverOptions(server.target(), "rollout-0"));
  ASSERT_TRUE(WaitUntil([&] { return a->connected(); }));
  ASSERT_OK(server.Publish(1));
  a.ExpectAndLoad(1);
  const auto published = InfoLabels(server.registry(), "asympo_broadcast_published_weights");
  const auto loaded = InfoLabels(*a.registry, "asympo_rollout_weights_info");
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded, published);
  EXPECT_EQ(loaded.at("version"), "1");
  EXPECT_EQ(loaded.at("digest").size(), 16u);
  ASSERT_OK(server.Publish(2));  // other bytes
  a.ExpectAndLoad(2);
  const auto next = InfoLabels(*a.registry, "asympo_rollout_weights_info");  // one series still
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next, InfoLabels(server.registry(), "asympo_broadcast_published_weights"));
  EXPECT_NE(next.at("digest"), loaded.at("digest"));
}

TEST(BroadcastTest, LateJoinerGetsOnlyTheLatestVersion) {
  SenderServer server(SmallBuckets());
  for (uint64_t v : {3, 4, 7}) ASSERT_OK(server.Publish(v));
  Rx late(ReceiverOptions(server.target(), "late"));
  late.ExpectAndLoad(7);
  EXPECT_EQ(late.Metric("asympo_rollout_weight_fetch_seconds"), 1);  // 3 and 4 never fetched
  EXPECT_EQ(late->latest_announced(), 7u);
}

// Subscribes directly with `after_version`; the first announcement's
// version, or -1 when none comes within 200 ms.
int64_t FirstAnnouncement(SenderServer& server, uint64_t after_version) {
  auto stub = server.NewStub();
  v1::RegisterRequest reg;
  // An id of its own: without an authorizer a receiver id stays with the
  // connection that registered it for a while after its stream ends, and
  // each call may come on another connection.
  static int calls = 0;
  reg.set_receiver_id("direct-" + std::to_string(++calls));
  reg.set_model_signature(ModelSignature(testing::TestSpecs()));
  v1::RegisterResponse resp;
  grpc::ClientContext rctx;
  if (!stub->Register(&rctx, reg, &resp).ok()) return -2;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  v1::SubscribeRequest req;
  req.set_session_id(resp.session_id());
  req.set_after_version(after_version);
  auto reader = stub->Subscribe(&ctx, req);
  v1::SnapshotAnnouncement a;
  return reader->Read(&a) ? static_cast<int64_t>(a.manifest().version()) : -1;
}

TEST(BroadcastTest, AFreshLearnersVersionZeroReachesReceivers) {
  SenderServer server(SmallBuckets());
  Rx early(ReceiverOptions(server.target(), "early"));
  ASSERT_TRUE(WaitUntil([&] { return early->connected(); }));
  ASSERT_OK(server.Publish(0));  // the initial weights
  early.ExpectAndLoad(0);
  Rx late(ReceiverOptions(server.target(), "late"));
  late.ExpectAndLoad(0);
  // after_version 0 announces the latest whatever its version.
  EXPECT_EQ(FirstAnnouncement(server, 0), 0);

  ASSERT_OK(server.Publish(1));
  early.ExpectAndLoad(1);
  late.ExpectAndLoad(1);
  EXPECT_EQ(FirstAnnouncement(server, 0), 1);
  EXPECT_EQ(FirstAnnouncement(server, 1), -1);  // only newer than 1
}

TEST(BroadcastTest, PublishAdoptsHostBucketsLaidOutByTheSendersPlan) {
  SenderServer server(SmallBuckets());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const SnapshotPlan> plan,
                       server.store().Plan(testing::TestSpecs()));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const SnapshotPlan> again,
                       server.store().Plan(testing::TestSpecs()));
  EXPECT_EQ(again, plan) << "one plan for every snapshot";
  Rx a(ReceiverOptions(server.target(), "rollout-0"));
  HostBuckets host = testing::LaidOut(plan, 1);
  const std::weak_ptr<void> held = host.keep_alive;
  ASSERT_OK(server.store().Publish(1, std::move(host)));
  EXPECT_FALSE(held.expired()) << "the sender holds the buckets it adopted";
  ASSERT_TRUE(a->WaitForPending(absl::Seconds(2)));
  std::shared_ptr<const ReceivedSnapshot> got = a->TakePending();
  testing::ExpectWeightsOf(*got, 1);

  // The manifest on the wire is the one packing the tensors one by one made:
  // the plan's, with each bucket's CRC-32C.
  v1::SnapshotManifest want = *PlanSnapshot(testing::TestSpecs(), 1, testing::TestPacking());
  const std::vector<std::string> w = testing::Weights(1);
  std::vector<std::string> buckets;
  for (const v1::BucketInfo& b : want.buckets()) buckets.emplace_back(b.size_bytes(), '\0');
  for (int t = 0; t < want.tensors_size(); ++t) {
    const v1::TensorEntry& e = want.tensors(t);
    buckets[e.bucket()].replace(e.offset(), e.size_bytes(), w[static_cast<size_t>(t)]);
  }
  for (int b = 0; b < want.buckets_size(); ++b) {
    want.mutable_buckets(b)->set_crc32c(
        Crc32c(buckets[static_cast<size_t>(b)].data(), buckets[static_cast<size_t>(b)].size()));
  }
  EXPECT_EQ(got->manifest.SerializeAsString(), want.SerializeAsString());

  // Once a newer version replaces it and no fetch reads it, it is let go.
  ASSERT_OK(server.Publish(2));
  a.ExpectAndLoad(2);
  EXPECT_TRUE(WaitUntil([&] { return held.expired(); })) << "version 1's buckets are still held";

  // Buckets laid out by another plan (even an equal one) are refused.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const SnapshotPlan> foreign,
                       SnapshotPlan::Make(testing::TestSpecs(), testing::TestPacking()));
  EXPECT_THAT(server.store().Publish(3, testing::LaidOut(foreign, 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, "plan"));
  EXPECT_THAT(server.store().Plan({{"w", v1::DTYPE_F32, {2}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "signature"));
  EXPECT_EQ(server.store().latest_version(), 2u);
}

// Every transport reads the store (the sender above, the NCCL thread, the
// weight group): a reader sees the latest snapshot at once, then every new
// one with its bytes, and holds what it keeps.
TEST(BroadcastTest, AStoreReaderSeesEverySnapshotWithItsBytes) {
  SenderServer server(SmallBuckets());
  ASSERT_OK(server.Publish(1));
  std::vector<std::shared_ptr<const Snapshot>> seen;
  const int reader = server.store().AddReader(
      [&](const std::shared_ptr<const Snapshot>& snapshot) { seen.push_back(snapshot); });
  ASSERT_EQ(seen.size(), 1u) << "the latest snapshot at once";
  ASSERT_OK(server.Publish(2));
  ASSERT_EQ(seen.size(), 2u);
  for (uint64_t v : {1, 2}) {
    const Snapshot& s = *seen[v - 1];
    const v1::SnapshotManifest& m = s.manifest();
    EXPECT_EQ(m.version(), v);
    EXPECT_GT(m.buckets_size(), 1);
    const std::vector<std::string> w = testing::Weights(v);
    for (int t = 0; t < m.tensors_size(); ++t) {
      const v1::TensorEntry& e = m.tensors(t);
      const char* at = s.bucket(static_cast<int>(e.bucket())) + e.offset();
      EXPECT_EQ(std::string(at, e.size_bytes()), w[static_cast<size_t>(t)]) << e.name();
    }
    for (const v1::BucketInfo& b : m.buckets()) {
      EXPECT_EQ(Crc32c(s.bucket(static_cast<int>(b.index())), b.size_bytes()), b.crc32c())
          << "bucket " << b.index();
    }
  }
  // What the reader holds stays alive after newer versions.
  ASSERT_OK(server.Publish(3));
  EXPECT_EQ(std::string(seen[0]->bucket(0), 1), std::string(1, testing::WeightByte(1, 0, 0)));
  EXPECT_EQ(server.store().latest()->version(), 3u);
  server.store().RemoveReader(reader);
  ASSERT_OK(server.Publish(4));
  EXPECT_EQ(seen.size(), 3u);
}

TEST(BroadcastTest, PublishRejectsOldVersionsAndWrongTensors) {
  SenderServer server(SmallBuckets());
  ASSERT_OK(server.Publish(5));
  EXPECT_THAT(server.Publish(5), StatusIs(absl::StatusCode::kInvalidArgument, "not greater"));
  EXPECT_THAT(server.Publish(4), StatusIs(absl::StatusCode::kInvalidArgument, "not greater"));

  std::vector<std::string> w = testing::Weights(6);
  std::vector<TensorView> views = testing::Views(w);
  views[1].size_bytes -= 2;
  EXPECT_THAT(server.store().Publish(6, views),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.layers.0.mlp.up_proj.weight"));

  views = testing::Views(w);
  views[3].spec.shape = {10, 100};  // another architecture
  EXPECT_THAT(server.store().Publish(6, views),
              StatusIs(absl::StatusCode::kInvalidArgument, "signature"));
  EXPECT_EQ(server.store().latest_version(), 5u);
}

TEST(BroadcastTest, CorruptTransferIsCountedAndOldWeightsKept) {
  testing::ServerOptions o = SmallBuckets();
  o.corrupt_versions = {2};
  SenderServer server(o);
  Rx a(ReceiverOptions(server.target(), "rollout-0"));
  Rx b(ReceiverOptions(server.target(), "rollout-1"));
  ASSERT_OK(server.Publish(1));
  a.ExpectAndLoad(1);
  b.ExpectAndLoad(1);

  ASSERT_OK(server.Publish(2));
  ASSERT_TRUE(WaitUntil([&] { return a->failures() == 1 && b->failures() == 1; }));
  EXPECT_EQ(a->TakePending(), nullptr);
  EXPECT_EQ(b->TakePending(), nullptr);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_failures_total"), 1);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_version"), 1);
  // Both receivers report the checksum failure; they still sample with 1.
  ASSERT_TRUE(WaitUntil([&] { return server.Metric("asympo_broadcast_failures_total") == 2; }));
  EXPECT_THAT(server.sender().receiver_versions(),
              ElementsAre(Pair("rollout-0", 1), Pair("rollout-1", 1)));

  ASSERT_OK(server.Publish(3));
  a.ExpectAndLoad(3);
  b.ExpectAndLoad(3);
  EXPECT_EQ(a->failures(), 1);
}

TEST(BroadcastTest, RegisterRefusesAnotherModelAndBadIds) {
  SenderServer server(SmallBuckets());
  auto stub = server.NewStub();
  v1::RegisterRequest req;
  req.set_receiver_id("rollout-0");
  req.set_model_signature("4-deadbeef");
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->Register(&ctx, req, &resp);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::FAILED_PRECONDITION, "4-deadbeef"));
  // The learner's own signature is not handed to whoever asks: GetStatus
  // gives it to a caller with the role status.
  EXPECT_THAT(s.error_message(), Not(HasSubstr(ModelSignature(testing::TestSpecs()))));

  req.set_model_signature(ModelSignature(testing::TestSpecs()));
  for (const std::string& id : {std::string(), std::string(129, 'r')}) {
    req.set_receiver_id(id);
    grpc::ClientContext c;
    EXPECT_THAT(stub->Register(&c, req, &resp), StatusIs(grpc::StatusCode::INVALID_ARGUMENT));
  }
  req.set_receiver_id(std::string(128, 'r'));
  grpc::ClientContext c;
  ASSERT_OK(stub->Register(&c, req, &resp));
  EXPECT_EQ(resp.transport(), v1::TRANSPORT_GRPC);
  EXPECT_FALSE(resp.session_id().empty());

  // A receiver of another model never connects, never loads, keeps trying.
  WeightReceiverOptions o = ReceiverOptions(server.target(), "other-model");
  o.model_signature = "4-deadbeef";
  Rx other(o);
  ASSERT_OK(server.Publish(1));
  EXPECT_FALSE(other->WaitForPending(absl::Milliseconds(150)));
  EXPECT_FALSE(other->connected());
  EXPECT_EQ(server.sender().active_receivers(), 0);
}

// One rule with the weight group's Join (weight_group_test.cc,
// MalformedFieldsAreRefusedNamingTheField): an empty model signature is
// refused, naming the field.
TEST(BroadcastTest, RegisterRefusesAnEmptyModelSignature) {
  SenderServer server(SmallBuckets());
  auto stub = server.NewStub();
  v1::RegisterRequest req;
  req.set_receiver_id("rollout-0");
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  EXPECT_THAT(stub->Register(&ctx, req, &resp),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, "model_signature is empty"));
}

TEST(BroadcastTest, UnknownSessionIsRefusedOnEveryCall) {
  SenderServer server(SmallBuckets());
  ASSERT_OK(server.Publish(1));
  auto stub = server.NewStub();
  {
    grpc::ClientContext ctx;
    v1::SubscribeRequest req;
    req.set_session_id("no-such-session");
    auto reader = stub->Subscribe(&ctx, req);
    v1::SnapshotAnnouncement a;
    EXPECT_FALSE(reader->Read(&a));
    EXPECT_THAT(reader->Finish(), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  }
  {
    grpc::ClientContext ctx;
    v1::FetchSnapshotRequest req;
    req.set_session_id("no-such-session");
    req.set_version(1);
    auto reader = stub->FetchSnapshot(&ctx, req);
    v1::WeightChunk c;
    EXPECT_FALSE(reader->Read(&c));
    EXPECT_THAT(reader->Finish(), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  }
  {
    grpc::ClientContext ctx;
    v1::ReportVersionRequest req;
    req.set_session_id("no-such-session");
    v1::ReportVersionResponse resp;
    EXPECT_THAT(stub->ReportVersion(&ctx, req, &resp),
                StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  }
}

// Registers directly and fetches `version` with `max_chunk`, returning the
// chunks (or the status when the fetch fails).
struct Fetched {
  grpc::Status status;
  std::vector<v1::WeightChunk> chunks;
};

std::string RegisterDirect(v1::WeightBroadcast::Stub* stub, const std::string& id) {
  v1::RegisterRequest req;
  req.set_receiver_id(id);
  req.set_model_signature(ModelSignature(testing::TestSpecs()));
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  EXPECT_OK(stub->Register(&ctx, req, &resp));
  return resp.session_id();
}

Fetched FetchDirect(v1::WeightBroadcast::Stub* stub, const std::string& session, uint64_t version,
                    uint32_t max_chunk, const std::string& incarnation = "") {
  grpc::ClientContext ctx;
  v1::FetchSnapshotRequest req;
  req.set_session_id(session);
  req.set_version(version);
  req.set_max_chunk_bytes(max_chunk);
  req.set_incarnation(incarnation);
  auto reader = stub->FetchSnapshot(&ctx, req);
  Fetched f;
  v1::WeightChunk c;
  while (reader->Read(&c)) f.chunks.push_back(c);
  f.status = reader->Finish();
  return f;
}

TEST(BroadcastTest, FetchOfAVersionNotHeldIsNotFound) {
  SenderServer server(SmallBuckets());
  auto stub = server.NewStub();
  const std::string session = RegisterDirect(stub.get(), "direct");
  EXPECT_THAT(FetchDirect(stub.get(), session, 1, 0).status,
              StatusIs(grpc::StatusCode::NOT_FOUND));  // nothing published yet
  ASSERT_OK(server.Publish(1));
  ASSERT_OK(server.Publish(2));
  EXPECT_THAT(FetchDirect(stub.get(), session, 1, 0).status,
              StatusIs(grpc::StatusCode::NOT_FOUND));  // replaced
  EXPECT_THAT(FetchDirect(stub.get(), session, 3, 0).status,
              StatusIs(grpc::StatusCode::NOT_FOUND));  // not yet
  EXPECT_OK(FetchDirect(stub.get(), session, 2, 0).status);
  EXPECT_EQ(server.Metric("asympo_broadcast_failures_total"), 0);  // refusals are no failures
}

// A receiver that was told of version 6 by a learner process killed before
// it fetched asks the restarted learner (another incarnation, its own
// version 6) for it: NOT_FOUND, not the other weights (seen at 0.6B:
// bench/rehearsal.py's weight-group worker fell back to gRPC and fetched the
// resumed learner's version 6 under the dead one's manifest).
TEST(BroadcastTest, AFetchOfAnotherIncarnationsVersionIsNotFound) {
  testing::ServerOptions o = SmallBuckets();
  o.incarnation = "resumed";
  SenderServer server(o);
  auto stub = server.NewStub();
  const std::string session = RegisterDirect(stub.get(), "direct");
  ASSERT_OK(server.Publish(6));
  const Fetched other = FetchDirect(stub.get(), session, 6, 0, "killed");
  EXPECT_THAT(other.status, StatusIs(grpc::StatusCode::NOT_FOUND,
                                     "of incarnation \"killed\" is not held: this learner is "
                                     "incarnation resumed"));
  EXPECT_TRUE(other.chunks.empty());
  EXPECT_OK(FetchDirect(stub.get(), session, 6, 0, "resumed").status);
  EXPECT_OK(FetchDirect(stub.get(), session, 6, 0).status);  // any incarnation
}

TEST(BroadcastTest, ChunksRespectTheRequestedSizeAndTheCap) {
  testing::ServerOptions o = SmallBuckets();
  o.default_chunk_bytes = 1000;
  o.max_chunk_bytes_cap = 3000;
  o.min_chunk_bytes = 1;  // this test's buckets are small; the floor has its own test
  SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  const v1::SnapshotManifest m = *PlanSnapshot(testing::TestSpecs(), 1, testing::TestPacking());
  auto stub = server.NewStub();
  const std::string session = RegisterDirect(stub.get(), "direct");

  // (requested, expected chunk size): 0 takes the default; big asks are capped.
  for (auto [ask, size] : std::vector<std::pair<uint32_t, uint64_t>>{
           {1, 1}, {7, 7}, {0, 1000}, {4096, 3000}, {1u << 30, 3000}}) {
    SCOPED_TRACE(ask);
    Fetched f = FetchDirect(stub.get(), session, 1, ask);
    ASSERT_OK(f.status);
    uint64_t expected_chunks = 0;
    for (const auto& b : m.buckets()) expected_chunks += (b.size_bytes() + size - 1) / size;
    EXPECT_EQ(f.chunks.size(), expected_chunks);
    std::vector<uint64_t> next(static_cast<size_t>(m.buckets_size()), 0);
    for (const v1::WeightChunk& c : f.chunks) {
      EXPECT_EQ(c.version(), 1u);
      ASSERT_LT(c.bucket(), next.size());
      EXPECT_EQ(c.offset(), next[c.bucket()]);  // in order, no gap
      EXPECT_LE(c.data().size(), size);
      next[c.bucket()] += c.data().size();
    }
    for (int b = 0; b < m.buckets_size(); ++b) EXPECT_EQ(next[b], m.buckets(b).size_bytes());
  }

  // Receivers asking for 1-byte chunks and for chunks larger than any
  // bucket both reassemble the snapshot exactly.
  WeightReceiverOptions tiny = ReceiverOptions(server.target(), "tiny-chunks");
  tiny.max_chunk_bytes = 1;
  WeightReceiverOptions huge = ReceiverOptions(server.target(), "huge-chunks");
  huge.max_chunk_bytes = 1u << 20;
  Rx a(tiny), b(huge);
  a.ExpectAndLoad(1);
  b.ExpectAndLoad(1);
}

TEST(BroadcastTest, TinyChunkRequestsAreRaisedToTheFloor) {
  testing::ServerOptions o = SmallBuckets();
  o.min_chunk_bytes = 500;
  SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  auto stub = server.NewStub();
  const std::string session = RegisterDirect(stub.get(), "direct");
  const Fetched f = FetchDirect(stub.get(), session, 1, 1);  // asks for 1-byte chunks
  ASSERT_OK(f.status);
  const v1::SnapshotManifest m = *PlanSnapshot(testing::TestSpecs(), 1, testing::TestPacking());
  uint64_t expected = 0;
  for (const auto& b : m.buckets()) expected += (b.size_bytes() + 499) / 500;
  EXPECT_EQ(f.chunks.size(), expected);
  EXPECT_EQ(testing::ServerOptions().min_chunk_bytes, 64u << 10);
}

TEST(BroadcastTest, HugeIdsAreNotEchoedAndUnpublishedVersionsAreRefused) {
  SenderServer server(SmallBuckets());
  ASSERT_OK(server.Publish(3));
  auto stub = server.NewStub();
  {  // a 4000-byte signature: the error names the rule, not all of it
    v1::RegisterRequest req;
    req.set_receiver_id("rollout-0");
    req.set_model_signature(std::string(4000, 's'));
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->Register(&ctx, req, &resp);
    EXPECT_THAT(
        s, StatusIs(grpc::StatusCode::FAILED_PRECONDITION, "both must run the same architecture"));
    EXPECT_LT(s.error_message().size(), 400u);
  }
  {  // a 1 MiB signature or session id: refused on its size before parsing
    v1::RegisterRequest req;
    req.set_receiver_id("rollout-0");
    req.set_model_signature(std::string(1 << 20, 's'));
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->Register(&ctx, req, &resp);
    EXPECT_THAT(s, StatusIs(grpc::StatusCode::INVALID_ARGUMENT,
                            "a asympo.v1.RegisterRequest is at most 65536"));
    EXPECT_LT(s.error_message().size(), 400u);
    grpc::ClientContext report_ctx;
    v1::ReportVersionRequest report;
    report.set_session_id(std::string(1 << 20, 'x'));
    v1::ReportVersionResponse ignored;
    const grpc::Status r = stub->ReportVersion(&report_ctx, report, &ignored);
    EXPECT_THAT(r, StatusIs(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_LT(r.error_message().size(), 400u);
  }
  {  // a 1000-byte session id
    grpc::ClientContext ctx;
    v1::ReportVersionRequest req;
    req.set_session_id(std::string(1000, 'x'));
    v1::ReportVersionResponse resp;
    const grpc::Status s = stub->ReportVersion(&ctx, req, &resp);
    EXPECT_THAT(s, StatusIs(grpc::StatusCode::FAILED_PRECONDITION, "register again"));
    EXPECT_LT(s.error_message().size(), 400u);
  }
  const std::string session = RegisterDirect(stub.get(), "liar");
  grpc::ClientContext ctx;
  v1::ReportVersionRequest req;
  req.set_session_id(session);
  req.set_version(9200000000000000000ull);
  req.set_error("forged");
  v1::ReportVersionResponse resp;
  const grpc::Status s = stub->ReportVersion(&ctx, req, &resp);
  EXPECT_THAT(
      s, StatusIs(grpc::StatusCode::INVALID_ARGUMENT, "was never published (the newest is 3)"));
  EXPECT_EQ(server.Metric("asympo_broadcast_failures_total"), 0);  // not counted
  grpc::ClientContext ok_ctx;
  req.set_version(3);
  req.clear_error();
  EXPECT_OK(stub->ReportVersion(&ok_ctx, req, &resp));
}

// A client that registers again and again, or reports the same failure in
// a loop, gets a log line every 10 s, not one per call; a session's reports
// count once per failure_count_interval (10 s), so a loop of fake reports
// cannot raise the failure count at will.
TEST(BroadcastTest, RepeatedRegistrationsAndReportsDoNotFloodTheLog) {
  SenderServer server;
  ASSERT_OK(server.Publish(1));
  auto stub = server.NewStub();
  const asympo::testing::LineCounter again("registered again");
  const asympo::testing::LineCounter reports("reports: \"cannot load");
  std::string session;
  for (int i = 0; i < 40; ++i) session = RegisterDirect(stub.get(), "rollout-0");
  for (int i = 0; i < 40; ++i) {
    grpc::ClientContext ctx;
    v1::ReportVersionRequest req;
    req.set_session_id(session);
    req.set_version(1);
    req.set_error("cannot load version 1");
    v1::ReportVersionResponse resp;
    ASSERT_OK(stub->ReportVersion(&ctx, req, &resp));
  }
  EXPECT_EQ(again.count(), 1);
  EXPECT_EQ(reports.count(), 1);
  EXPECT_EQ(server.Metric("asympo_broadcast_failures_total"), 1);
}

TEST(BroadcastTest, UnsubscribedRegistrationsExpireAndAreBounded) {
  testing::ServerOptions o = SmallBuckets();
  o.unsubscribed_session_ttl = absl::Milliseconds(300);
  asympo::testing::FakeClock clock;  // registrations expire when it moves on
  o.clock = &clock;
  o.max_sessions = 3;
  o.max_sessions_per_principal = 3;  // one client here; shares have a test of their own
  SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  auto stub = server.NewStub();
  const auto try_register = [&](const std::string& id) {
    v1::RegisterRequest req;
    req.set_receiver_id(id);
    req.set_model_signature(ModelSignature(testing::TestSpecs()));
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    return stub->Register(&ctx, req, &resp);
  };
  const std::string first = RegisterDirect(stub.get(), "flood-0");
  ASSERT_FALSE(first.empty());
  ASSERT_OK(try_register("flood-1"));
  ASSERT_OK(try_register("flood-2"));
  const grpc::Status full = try_register("flood-3");
  EXPECT_THAT(full, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_OK(try_register("flood-2"));  // registering again replaces, never refused
  clock.Advance(absl::Milliseconds(299));
  EXPECT_THAT(try_register("flood-3"), StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED));
  clock.Advance(absl::Milliseconds(101));
  EXPECT_OK(try_register("flood-3"));  // the old ones expired
  grpc::ClientContext ctx;
  v1::SubscribeRequest req;
  req.set_session_id(first);
  auto reader = stub->Subscribe(&ctx, req);
  v1::SnapshotAnnouncement a;
  EXPECT_FALSE(reader->Read(&a));
  EXPECT_THAT(reader->Finish(), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));

  // A subscribed receiver outlives the limit on unsubscribed ones.
  Rx live(ReceiverOptions(server.target(), "live"));
  live.ExpectAndLoad(1);
  clock.Advance(absl::Milliseconds(400));
  EXPECT_OK(try_register("flood-4"));
  EXPECT_TRUE(live->connected());
  EXPECT_EQ(server.sender().active_receivers(), 1);
}

TEST(BroadcastTest, FetchesUnderWayAreBoundedPerSessionAndInAll) {
  testing::ServerOptions o = SmallBuckets();
  o.min_chunk_bytes = 1;
  o.chunk_delay = absl::Milliseconds(50);  // every fetch stays under way for a while
  o.max_fetches_per_session = 2;
  o.max_concurrent_fetches = 3;
  o.max_fetches_per_principal = 3;  // one client here; shares have a test of their own
  SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  auto stub = server.NewStub();
  struct Open {
    std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<grpc::ClientReader<v1::WeightChunk>> reader;
  };
  const auto open = [&](const std::string& session) {
    Open f;
    v1::FetchSnapshotRequest req;
    req.set_session_id(session);
    req.set_version(1);
    req.set_max_chunk_bytes(16);
    f.reader = stub->FetchSnapshot(f.ctx.get(), req);
    return f;
  };
  const auto refused = [&](Open f) {
    v1::WeightChunk c;
    while (f.reader->Read(&c)) {
    }
    const grpc::Status s = f.reader->Finish();
    return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  };
  const std::string a = RegisterDirect(stub.get(), "a");
  const std::string b = RegisterDirect(stub.get(), "b");
  std::vector<Open> held;
  held.push_back(open(a));
  held.push_back(open(a));
  v1::WeightChunk c;
  for (Open& f : held) ASSERT_TRUE(f.reader->Read(&c));  // both started
  EXPECT_TRUE(refused(open(a)));                         // a third for one session
  held.push_back(open(b));
  ASSERT_TRUE(held.back().reader->Read(&c));
  EXPECT_TRUE(refused(open(b)));  // the fourth in all
  for (Open& f : held) f.ctx->TryCancel();
  for (Open& f : held) f.reader->Finish().IgnoreError();
  held.clear();
  // Ended fetches free their places.
  ASSERT_TRUE(
      asympo::testing::WaitFor([&] { return FetchDirect(stub.get(), a, 1, 4096).status.ok(); }));
}

TEST(BroadcastTest, ReceiversFollowARestartedLearnerBackwards) {
  auto first = std::make_unique<SenderServer>(SmallBuckets());
  const int port = first->port();
  Rx a(ReceiverOptions(first->target(), "rollout-0"));
  Rx b(ReceiverOptions(first->target(), "rollout-1"));
  ASSERT_OK(first->Publish(5));
  a.ExpectAndLoad(5);
  b.ExpectAndLoad(5);

  // Shutdown ends the streams: the receivers notice at once.
  first->sender().Shutdown();
  ASSERT_TRUE(WaitUntil([&] { return !a->connected() && !b->connected(); }));
  // The sender drops a session when its stream's OnDone runs, which may come
  // after the receiver has seen the stream end.
  EXPECT_TRUE(WaitUntil([&] { return first->sender().active_receivers() == 0; }))
      << first->sender().active_receivers();
  first.reset();

  // The learner comes back on the same port from an older checkpoint.
  SenderServer second(SmallBuckets(), port);
  ASSERT_EQ(second.port(), port);
  ASSERT_TRUE(WaitUntil([&] { return second.sender().active_receivers() == 2; }));
  // Registration carried the version each receiver samples with.
  EXPECT_THAT(second.sender().receiver_versions(),
              ElementsAre(Pair("rollout-0", 5), Pair("rollout-1", 5)));
  ASSERT_OK(second.Publish(3));
  a.ExpectAndLoad(3);
  b.ExpectAndLoad(3);
  ASSERT_OK(second.Publish(4));
  a.ExpectAndLoad(4);
  EXPECT_EQ(a->failures(), 0);
  EXPECT_EQ(a.Metric("asympo_rollout_weight_connected"), 1);
}

// A learner killed at version 5 whose restart trains a different version 5
// (its newest checkpoint was older): the number is the same, the weights
// are not. Receivers fetch by incarnation and content, not by number alone.
TEST(BroadcastTest, ARestartedLearnersOtherWeightsUnderTheSameVersionAreFetched) {
  const auto sender_of = [](const std::string& incarnation, int port) {
    testing::ServerOptions o = SmallBuckets();
    o.incarnation = incarnation;
    return std::make_unique<SenderServer>(o, port);
  };
  const auto restart = [](std::unique_ptr<SenderServer>* server, Rx& rx, std::string incarnation) {
    const int port = (*server)->port();
    (*server)->sender().Shutdown();
    EXPECT_TRUE(WaitUntil([&] { return !rx->connected(); }));
    server->reset();
    testing::ServerOptions o = SmallBuckets();
    o.incarnation = std::move(incarnation);
    *server = std::make_unique<SenderServer>(o, port);
    EXPECT_TRUE(WaitUntil([&] { return (*server)->sender().active_receivers() == 1; }));
  };
  std::unique_ptr<SenderServer> server = sender_of("first", 0);
  Rx rx(ReceiverOptions(server->target(), "rollout-0"));
  ASSERT_OK(server->Publish(5));
  rx.ExpectAndLoad(5);

  restart(&server, rx, "second");
  // It holds the first incarnation's 5: none of this one's weights.
  EXPECT_THAT(server->sender().receiver_versions(), ElementsAre(Pair("rollout-0", 0)));
  const std::vector<std::string> retrained = testing::Weights(105);
  ASSERT_OK(server->store().Publish(5, testing::Views(retrained)));
  ASSERT_TRUE(rx->WaitForPending(absl::Seconds(2))) << "the retrained version 5 was not fetched";
  std::shared_ptr<const ReceivedSnapshot> got = rx->TakePending();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->manifest.incarnation(), "second");
  ASSERT_EQ(got->manifest.tensors_size(), static_cast<int>(retrained.size()));
  for (int t = 0; t < got->manifest.tensors_size(); ++t) {
    EXPECT_EQ(got->TensorBytes(got->manifest.tensors(t)), retrained[static_cast<size_t>(t)]) << t;
  }
  rx->ReportLoaded(5);
  EXPECT_TRUE(WaitUntil([&] {
    return server->sender().receiver_versions() ==
           std::vector<std::pair<std::string, uint64_t>>{{"rollout-0", 5}};
  }));

  // Restarted again from the checkpoint of exactly those weights: the same
  // bytes under the same number are not fetched again, and the receiver
  // counts as holding this incarnation's version 5.
  restart(&server, rx, "third");
  ASSERT_OK(server->store().Publish(5, testing::Views(retrained)));
  EXPECT_TRUE(WaitUntil([&] {
    return server->sender().receiver_versions() ==
           std::vector<std::pair<std::string, uint64_t>>{{"rollout-0", 5}};
  }));
  EXPECT_FALSE(rx->WaitForPending(absl::Milliseconds(300)));
  EXPECT_EQ(rx.Metric("asympo_rollout_weight_fetch_seconds"), 2);  // two fetches in all
  EXPECT_EQ(rx->failures(), 0);
}

TEST(BroadcastTest, RegisteringAgainReplacesTheOldSession) {
  SenderServer server(SmallBuckets());
  auto stub = server.NewStub();
  const std::string old_session = RegisterDirect(stub.get(), "rollout-0");
  const std::string new_session = RegisterDirect(stub.get(), "rollout-0");
  EXPECT_NE(old_session, new_session);
  ASSERT_OK(server.Publish(1));
  EXPECT_THAT(FetchDirect(stub.get(), old_session, 1, 0).status,
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_OK(FetchDirect(stub.get(), new_session, 1, 0).status);
  EXPECT_EQ(server.sender().receiver_versions().size(), 1u);
}

TEST(BroadcastTest, SlowReceiverSkipsToTheNewestVersion) {
  testing::ServerOptions o = SmallBuckets();
  o.default_chunk_bytes = 512;
  o.chunk_delay = absl::Milliseconds(15);  // ~20 chunks: each fetch takes ~0.3 s
  SenderServer server(o);
  Rx a(ReceiverOptions(server.target(), "slow"));
  ASSERT_TRUE(WaitUntil([&] { return a->connected(); }));
  ASSERT_OK(server.Publish(1));
  ASSERT_TRUE(WaitUntil([&] { return server.Metric("asympo_broadcast_bytes_total") > 0; }));
  for (uint64_t v : {2, 3, 4}) ASSERT_OK(server.Publish(v));  // while 1 is in flight
  ASSERT_TRUE(WaitUntil([&] { return a.Metric("asympo_rollout_weight_fetch_seconds") == 2; }));
  a.ExpectAndLoad(4);  // 1 was replaced while pending; 2 and 3 were never fetched
  EXPECT_EQ(a->failures(), 0);
}

TEST(BroadcastTest, StopIsPromptDuringAFetchAndTheSenderCountsTheCancel) {
  testing::ServerOptions o = SmallBuckets();
  o.default_chunk_bytes = 64;  // ~140 chunks, 0.2 s apart: the fetch is far from done
  o.chunk_delay = absl::Milliseconds(200);
  SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  Rx a(ReceiverOptions(server.target(), "stopped"));
  ASSERT_TRUE(WaitUntil([&] { return server.Metric("asympo_broadcast_bytes_total") > 0; }));
  const auto t0 = std::chrono::steady_clock::now();
  a->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_EQ(a->failures(), 0);  // stopping is not a failed transfer
  ASSERT_TRUE(WaitUntil([&] { return server.Metric("asympo_broadcast_failures_total") == 1; }));
  EXPECT_EQ(server.Metric("asympo_broadcast_transfer_seconds"), 0);
}

TEST(BroadcastTest, StopIsPromptWhileTheLearnerIsDown) {
  int port;
  {
    SenderServer gone;
    port = gone.port();
  }
  WeightReceiverOptions o = ReceiverOptions("127.0.0.1:" + std::to_string(port), "orphan");
  o.min_backoff = absl::Seconds(5);  // it is sleeping in its backoff when stopped
  o.max_backoff = absl::Seconds(30);
  Rx a(o);
  EXPECT_FALSE(a->WaitForPending(absl::Milliseconds(50)));
  EXPECT_FALSE(a->connected());
  const auto t0 = std::chrono::steady_clock::now();
  a->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
}

TEST(BroadcastTest, ReceiverRejectsBadOptions) {
  prometheus::Registry registry;
  WeightReceiverOptions o = ReceiverOptions("127.0.0.1:1", "");
  EXPECT_THAT(WeightReceiver::Start(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "receiver_id"));
  o = ReceiverOptions("127.0.0.1:1", "r");
  o.max_backoff = absl::Milliseconds(1);
  EXPECT_THAT(WeightReceiver::Start(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "backoff"));
  o = ReceiverOptions("", "r");
  EXPECT_THAT(WeightReceiver::Start(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "target"));
}

}  // namespace
}  // namespace asympo::broadcast
