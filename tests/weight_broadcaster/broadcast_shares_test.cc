// The sender without an authorizer: a weight session is its connection's,
// registrations are shared per peer address, and a Register's version
// cannot exceed what was published.
#include <cstdint>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testing::SenderServer;

// A stub on a connection of its own.
std::unique_ptr<v1::WeightBroadcast::Stub> OwnConnection(const SenderServer& server) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::WeightBroadcast::NewStub(
      grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args));
}

grpc::Status Register(v1::WeightBroadcast::Stub* stub, const std::string& id,
                      v1::RegisterResponse* resp, uint64_t version = 0) {
  v1::RegisterRequest req;
  req.set_receiver_id(id);
  req.set_model_signature(ModelSignature(testing::TestSpecs()));
  req.set_current_version(version);
  grpc::ClientContext ctx;
  return stub->Register(&ctx, req, resp);
}

// Subscribes `session` and waits for its first announcement.
struct Subscribed {
  Subscribed(v1::WeightBroadcast::Stub* stub, const std::string& session) {
    v1::SubscribeRequest req;
    req.set_session_id(session);
    reader = stub->Subscribe(&ctx, req);
    ok = reader->Read(&first);
  }
  ~Subscribed() {
    ctx.TryCancel();
    reader->Finish().IgnoreError();
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::SnapshotAnnouncement>> reader;
  v1::SnapshotAnnouncement first;
  bool ok = false;
};

TEST(BroadcastSharesTest, AnotherConnectionCannotTakeASubscribedReceiverId) {
  SenderServer server;
  ASSERT_OK(server.Publish(1));
  auto owner = OwnConnection(server), other = OwnConnection(server);
  v1::RegisterResponse mine, theirs;
  ASSERT_OK(Register(owner.get(), "victim", &mine));
  Subscribed stream(owner.get(), mine.session_id());
  ASSERT_TRUE(stream.ok);
  const grpc::Status s = Register(other.get(), "victim", &theirs);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::PERMISSION_DENIED, "another connection"));
  EXPECT_EQ(server.sender().active_receivers(), 1);
  // Its own connection may register again (the receiver's own restart of
  // the session).
  EXPECT_OK(Register(owner.get(), "victim", &mine));
}

TEST(BroadcastSharesTest, RegistrationsAreSharedPerPeerAddress) {
  testing::ServerOptions o;
  o.max_sessions = 8;
  o.max_sessions_per_principal = 2;
  SenderServer server(o);
  ASSERT_OK(server.Publish(1));
  auto stub = OwnConnection(server);
  v1::RegisterResponse r;
  ASSERT_OK(Register(stub.get(), "a", &r));
  ASSERT_OK(Register(stub.get(), "b", &r));
  ASSERT_OK(Register(stub.get(), "b", &r));  // again: its own place
  const grpc::Status s = Register(stub.get(), "c", &r);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "\"peer 127.0.0.1\" holds 2 registrations"));
}

TEST(BroadcastSharesTest, ARegisteredVersionAboveTheLatestIsTakenAsTheLatest) {
  SenderServer server;
  ASSERT_OK(server.Publish(3));
  auto stub = OwnConnection(server);
  v1::RegisterResponse r;
  ASSERT_OK(Register(stub.get(), "liar", &r, uint64_t{1} << 63));
  Subscribed stream(stub.get(), r.session_id());
  ASSERT_TRUE(stream.ok);
  EXPECT_THAT(server.sender().receiver_versions(), ElementsAre(Pair("liar", 3)));
  EXPECT_LE(server.Metric("asympo_broadcast_oldest_receiver_version"), 3);
}

}  // namespace
}  // namespace asympo::broadcast
