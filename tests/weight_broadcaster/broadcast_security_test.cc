// The WeightBroadcast service with bearer tokens and roles: who may fetch
// weights, sessions that belong to their principal, and requests that do
// not parse.
#include <atomic>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "tests/testing/authorizer_metrics.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::RawUnaryCall;
using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;
using testing::SenderServer;

class BroadcastSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Path("principals.json"))
        << absl::StrCat(R"({"principals": [)", R"({"name": "a", "token_sha256": ")",
                        security::Sha256Hex("a-tok"), R"(", "roles": ["read_weights"]},)",
                        R"({"name": "b", "token_sha256": ")", security::Sha256Hex("b-tok"),
                        R"(", "roles": ["read_weights"]},)", R"({"name": "gen", "token_sha256": ")",
                        security::Sha256Hex("gen-tok"), R"(", "roles": ["submit"]}]})");
    for (const char* t : {"a-tok", "b-tok", "gen-tok"}) std::ofstream(dir_.Path(t)) << t;
    security::AuthOptions auth;
    auth.principals_file = dir_.Path("principals.json");
    auto authorizer = security::Authorizer::Create(auth, metrics_.refusals, metrics_.registry);
    ASSERT_OK(authorizer);
    authorizer_ = *std::move(authorizer);
    testing::ServerOptions o;
    o.packing = testing::TestPacking();
    o.authorizer = authorizer_.get();
    o.received_bytes = &received_;
    server_ = std::make_unique<SenderServer>(o);
    ASSERT_OK(server_->Publish(1));
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& token) {
    security::ClientTlsOptions o;
    if (!token.empty()) o.token_file = dir_.Path(token);
    auto channel = security::CreateClientChannel(server_->target(), o, client_registry_);
    EXPECT_OK(channel);
    return *channel;
  }

  grpc::Status Register(const std::string& token, const std::string& receiver,
                        v1::RegisterResponse* response) {
    grpc::ClientContext ctx;
    v1::RegisterRequest r;
    r.set_receiver_id(receiver);
    r.set_model_signature(ModelSignature(testing::TestSpecs()));
    return v1::WeightBroadcast::NewStub(Channel(token))->Register(&ctx, r, response);
  }

  asympo::testing::ScopedTempDir dir_{"bauth"};
  asympo::testing::AuthorizerMetrics metrics_;
  prometheus::Registry client_registry_;  // the clients' asympo_tls_*
  std::unique_ptr<security::Authorizer> authorizer_;
  std::atomic<int64_t> received_{0};
  std::unique_ptr<SenderServer> server_;
};

TEST_F(BroadcastSecurityTest, OnlyTheRoleReadWeightsGetsWeights) {
  v1::RegisterResponse r;
  EXPECT_THAT(Register("gen-tok", "r1", &r), StatusIs(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(Register("", "r1", &r), StatusIs(grpc::StatusCode::UNAUTHENTICATED));
  ASSERT_OK(Register("a-tok", "r1", &r));
  // Fetching needs the role too, even with a valid session id.
  grpc::ClientContext ctx;
  v1::FetchSnapshotRequest f;
  f.set_session_id(r.session_id());
  f.set_version(1);
  auto reader = v1::WeightBroadcast::NewStub(Channel("gen-tok"))->FetchSnapshot(&ctx, f);
  v1::WeightChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_THAT(reader->Finish(), StatusIs(grpc::StatusCode::PERMISSION_DENIED));
}

// Every request's bytes are counted on every method, refused ones too (for
// the release of what requests leave on the heap: common/daemon/heap_release.h).
TEST_F(BroadcastSecurityTest, CountsTheBytesOfEveryRequest) {
  v1::RegisterResponse r;
  ASSERT_THAT(Register("gen-tok", "r1", &r), StatusIs(grpc::StatusCode::PERMISSION_DENIED));
  v1::RegisterRequest registration;
  registration.set_receiver_id("r1");
  registration.set_model_signature(ModelSignature(testing::TestSpecs()));
  int64_t expected = static_cast<int64_t>(registration.ByteSizeLong());
  EXPECT_EQ(received_.load(), expected);
  const std::string garbage = "\x0a\xff\xff\xff\xff\x0f";
  EXPECT_THAT(RawUnaryCall(Channel("a-tok"), "/asympo.v1.WeightBroadcast/ReportVersion", garbage),
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT));
  expected += static_cast<int64_t>(garbage.size());
  EXPECT_EQ(received_.load(), expected);
  auto stub = v1::WeightBroadcast::NewStub(Channel("gen-tok"));
  v1::SubscribeRequest subscribe;
  subscribe.set_session_id("s-1");
  grpc::ClientContext subscribe_ctx;
  auto announcements = stub->Subscribe(&subscribe_ctx, subscribe);
  v1::SnapshotAnnouncement announcement;
  EXPECT_FALSE(announcements->Read(&announcement));
  EXPECT_THAT(announcements->Finish(), StatusIs(grpc::StatusCode::PERMISSION_DENIED));
  expected += static_cast<int64_t>(subscribe.ByteSizeLong());
  v1::FetchSnapshotRequest fetch;
  fetch.set_session_id("s-1");
  fetch.set_version(1);
  grpc::ClientContext fetch_ctx;
  auto chunks = stub->FetchSnapshot(&fetch_ctx, fetch);
  v1::WeightChunk chunk;
  EXPECT_FALSE(chunks->Read(&chunk));
  EXPECT_THAT(chunks->Finish(), StatusIs(grpc::StatusCode::PERMISSION_DENIED));
  expected += static_cast<int64_t>(fetch.ByteSizeLong());
  EXPECT_EQ(received_.load(), expected);
}

TEST_F(BroadcastSecurityTest, ASessionBelongsToThePrincipalThatRegisteredIt) {
  v1::RegisterResponse mine;
  ASSERT_OK(Register("a-tok", "rollout-0", &mine));
  // b cannot take over a's receiver id ...
  v1::RegisterResponse theirs;
  const grpc::Status s = Register("b-tok", "rollout-0", &theirs);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::PERMISSION_DENIED, "registered by another principal"));
  // ... nor use a's session.
  auto b = v1::WeightBroadcast::NewStub(Channel("b-tok"));
  grpc::ClientContext report_ctx;
  v1::ReportVersionRequest report;
  report.set_session_id(mine.session_id());
  report.set_version(1);
  report.set_error("spoofed");
  v1::ReportVersionResponse ignored;
  EXPECT_THAT(b->ReportVersion(&report_ctx, report, &ignored),
              StatusIs(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_EQ(server_->Metric("asympo_broadcast_failures_total"), 0);
  grpc::ClientContext sub_ctx;
  v1::SubscribeRequest sub;
  sub.set_session_id(mine.session_id());
  auto stream = b->Subscribe(&sub_ctx, sub);
  v1::SnapshotAnnouncement a;
  EXPECT_FALSE(stream->Read(&a));
  EXPECT_THAT(stream->Finish(), StatusIs(grpc::StatusCode::PERMISSION_DENIED));
  // a's session is untouched: a registers again under its id at will.
  EXPECT_EQ(server_->sender().receiver_versions().size(), 1u);
  EXPECT_OK(Register("a-tok", "rollout-0", &mine));
}

TEST_F(BroadcastSecurityTest, RequestsThatDoNotParseAreInvalidArgumentsNamingTheType) {
  auto channel = Channel("a-tok");
  for (const char* method :
       {"/asympo.v1.WeightBroadcast/Register", "/asympo.v1.WeightBroadcast/ReportVersion"}) {
    const grpc::Status s = RawUnaryCall(channel, method, "\x0a\xff\xff\xff\xff\x0f");
    EXPECT_THAT(
        s, StatusIs(grpc::StatusCode::INVALID_ARGUMENT, "the request is not a valid asympo.v1."))
        << method;
  }
  // Invalid UTF-8 in a string field is named, not logged by protobuf.
  v1::RegisterRequest r;
  r.set_receiver_id("ok");
  std::string bytes = r.SerializeAsString();
  bytes[2] = '\xc3';
  const grpc::Status s = RawUnaryCall(channel, "/asympo.v1.WeightBroadcast/Register", bytes);
  EXPECT_THAT(s,
              StatusIs(grpc::StatusCode::INVALID_ARGUMENT, "field receiver_id is not valid UTF-8"));
}

}  // namespace
}  // namespace asympo::broadcast

namespace asympo::broadcast {
namespace {

// A fetch that makes no progress for fetch_idle_timeout is cancelled on the
// learner's side and its place given back (a receiver that never reads
// would otherwise pin the snapshot for good).
TEST(BroadcastLimitsTest, AStalledFetchIsCancelledByTheLearner) {
  testing::ServerOptions o;
  o.packing = testing::TestPacking();
  o.fetch_idle_timeout = absl::Milliseconds(200);
  o.chunk_delay = absl::Seconds(3);  // the stall
  testing::SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  auto stub = server.NewStub();
  const std::string session = [&] {
    grpc::ClientContext ctx;
    v1::RegisterRequest r;
    r.set_receiver_id("slow");
    r.set_model_signature(ModelSignature(testing::TestSpecs()));
    v1::RegisterResponse resp;
    EXPECT_OK(stub->Register(&ctx, r, &resp));
    return resp.session_id();
  }();
  grpc::ClientContext ctx;
  v1::FetchSnapshotRequest f;
  f.set_session_id(session);
  f.set_version(1);
  const absl::Time t0 = absl::Now();
  auto reader = stub->FetchSnapshot(&ctx, f);
  v1::WeightChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_THAT(reader->Finish(), StatusIs(grpc::StatusCode::CANCELLED));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  // Its place is free again: two more fetches of this session may start.
  grpc::ClientContext again;
  f.set_version(1);
  auto second = stub->FetchSnapshot(&again, f);
  again.TryCancel();
  second->Finish();
}

}  // namespace
}  // namespace asympo::broadcast
