// The WeightGroup service on a real gRPC server: what it refuses and why
// (malformed bytes included), who may call it, waiting calls that hold no
// thread and their limits, and a member that joins but never connects,
// which ends its generation and not the group. Several real workers, one restarted,
// and every version byte-exact: tests/integration/python_weight_group_test.py.
#include "weight_broadcaster/weight_group/weight_group.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "tests/testing/authorizer_metrics.h"
#include "tests/testing/metrics.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace asympo::broadcast {
namespace {

using ::testing::HasSubstr;

class WeightGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Path("principals.json"))
        << absl::StrCat(R"({"principals": [)", R"({"name": "engine", "token_sha256": ")",
                        security::Sha256Hex("engine-tok"), R"(", "roles": ["read_weights"]},)",
                        R"({"name": "gen", "token_sha256": ")", security::Sha256Hex("gen-tok"),
                        R"(", "roles": ["submit"]}]})");
    for (const char* t : {"engine-tok", "gen-tok"}) std::ofstream(dir_.Path(t)) << t;
    security::AuthOptions auth;
    auth.principals_file = dir_.Path("principals.json");
    auto authorizer = security::Authorizer::Create(auth, metrics_.refusals, metrics_.registry);
    ASSERT_OK(authorizer);
    authorizer_ = *std::move(authorizer);
    WeightGroupOptions o;
    o.timeout = timeout_;
    o.ready_timeout = absl::Seconds(1);
    o.join_window = absl::Milliseconds(100);
    o.authorizer = authorizer_.get();
    o.received_bytes = &received_;
    o.max_waiting = 300;
    o.max_waiting_per_caller = 200;
    auto group = WeightGroup::Create(o, store_, registry_);
    ASSERT_OK(group);
    group_ = *std::move(group);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(group_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (group_) group_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& token = "engine-tok") {
    security::ClientTlsOptions o;
    if (!token.empty()) o.token_file = dir_.Path(token);
    auto channel =
        security::CreateClientChannel(absl::StrCat("127.0.0.1:", port_), o, client_registry_);
    EXPECT_OK(channel);
    return channel.ok() ? *channel : nullptr;
  }
  std::unique_ptr<v1::WeightGroup::Stub> Stub(const std::string& token = "engine-tok") {
    return v1::WeightGroup::NewStub(Channel(token));
  }

  grpc::Status Join(v1::WeightGroup::Stub& stub, const std::string& id, v1::JoinGroupResponse* out,
                    const std::string& backend = "gloo", const std::string& signature = "sig-1") {
    grpc::ClientContext ctx;
    v1::JoinGroupRequest r;
    r.set_worker_id(id);
    r.set_backend(backend);
    r.set_model_signature(signature);
    r.set_wait_ms(3000);
    return stub.Join(&ctx, r, out);
  }

  grpc::Status Next(v1::WeightGroup::Stub& stub, const std::string& token,
                    v1::GroupNextResponse* out) {
    grpc::ClientContext ctx;
    v1::GroupNextRequest r;
    r.set_member_token(token);
    r.set_wait_ms(200);
    return stub.Next(&ctx, r, out);
  }

  grpc::Status StoreOp(v1::WeightGroup::Stub& stub, const std::string& token,
                       v1::GroupStoreRequest::Op op, std::vector<std::string> keys,
                       v1::GroupStoreResponse* out) {
    grpc::ClientContext ctx;
    v1::GroupStoreRequest r;
    r.set_member_token(token);
    r.set_op(op);
    for (std::string& k : keys) r.add_keys(std::move(k));
    r.set_value("v");
    return stub.Store(&ctx, r, out);
  }

  double Failures(const std::string& reason) {
    return asympo::testing::MetricValue(registry_, "asympo_weight_group_failures_total", reason);
  }

  asympo::testing::ScopedTempDir dir_{"wgroup"};
  asympo::testing::AuthorizerMetrics metrics_;
  absl::Duration timeout_ = absl::Milliseconds(500);  // the rendezvous's
  std::atomic<int64_t> received_{0};
  prometheus::Registry registry_;
  SnapshotStore store_{{}, "sig-1", registry_};  // what the group broadcasts
  prometheus::Registry client_registry_;
  std::unique_ptr<security::Authorizer> authorizer_;
  std::unique_ptr<WeightGroup> group_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(WeightGroupTest, BadRequestsAreRefusedNamingWhatIsWrong) {
  auto stub = Stub();
  v1::JoinGroupResponse join;
  grpc::Status s = Join(*stub, "", &join);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("worker_id"));
  s = Join(*stub, std::string(129, 'w'), &join);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("129"));
  s = Join(*stub, "w", &join, "nccl");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("backend is gloo"));
  s = Join(*stub, "w", &join, "gloo", "another-model");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("model_signature"));

  v1::GroupStoreResponse store;
  s = StoreOp(*stub, "no-such-token", v1::GroupStoreRequest::OP_SET, {"k"}, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("no-such-token"));
  std::vector<std::string> many(65, "k");
  s = StoreOp(*stub, "t", v1::GroupStoreRequest::OP_CHECK, many, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("at most 64 keys"));
  s = StoreOp(*stub, "t", v1::GroupStoreRequest::OP_GET, {"a", "b"}, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("one key"));
  s = StoreOp(*stub, "t", v1::GroupStoreRequest::OP_SET, {std::string(513, 'k')}, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("513 bytes"));

  v1::GroupNextResponse next;
  ASSERT_TRUE(Next(*stub, "no-such-token", &next).ok());
  EXPECT_EQ(next.action(), v1::GroupNextResponse::ACTION_REJOIN);
  EXPECT_EQ(group_->generation(), 0u) << "nobody joined";
}

// Requests are checked on the wire before they are parsed, like every other
// method's, and their bytes counted with every other request's.
TEST_F(WeightGroupTest, MalformedRequestsAreRefusedNamingTheFault) {
  const int64_t before = received_.load();
  for (const char* method : {"JoinGroupRequest", "GroupStoreRequest", "GroupNextRequest"}) {
    const std::string name = method;
    const std::string call = name == "JoinGroupRequest"    ? "Join"
                             : name == "GroupStoreRequest" ? "Store"
                                                           : "Next";
    // Field 1 (a string) whose length runs past the end of the message.
    grpc::Status s = asympo::testing::RawUnaryCall(
        Channel(), "/asympo.v1.WeightGroup/" + call, std::string("\x0a\x7f\x01\x02", 4));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << call;
    EXPECT_THAT(s.error_message(), HasSubstr("asympo.v1." + name)) << call;
  }
  EXPECT_EQ(received_.load() - before, 12) << "each request's 4 bytes";
  // A store value over its limit is refused on the wire, unread.
  v1::GroupStoreRequest big;
  big.set_op(v1::GroupStoreRequest::OP_SET);
  big.add_keys("k");
  big.set_value(std::string((1u << 20) + 1, 'v'));
  grpc::Status s = asympo::testing::RawUnaryCall(Channel(), "/asympo.v1.WeightGroup/Store",
                                                 big.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(group_->generation(), 0u);
}

// The threads of this process.
int Threads() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.exists();
  return n;
}

// A group whose rendezvous waits long enough for a test to use its store.
class WeightGroupSlowRendezvousTest : public WeightGroupTest {
 protected:
  WeightGroupSlowRendezvousTest() { timeout_ = absl::Seconds(5); }
};

// 200 store waits are parked, not served by 200 threads; the caller's next
// one is refused (RESOURCE_EXHAUSTED, counted as a refusal), and every
// parked call is answered when its keys are set.
TEST_F(WeightGroupSlowRendezvousTest, WaitingCallsHoldNoThreadAndAreLimitedPerCaller) {
  auto stub = Stub();
  v1::JoinGroupResponse member;
  ASSERT_TRUE(Join(*stub, "engine-0", &member).ok());
  ASSERT_TRUE(member.formed());
  const int threads_before = Threads();
  constexpr int kCalls = 200;
  std::vector<grpc::ClientContext> ctx(kCalls);
  std::vector<v1::GroupStoreRequest> req(kCalls);
  std::vector<v1::GroupStoreResponse> resp(kCalls);
  std::atomic<int> ready{0}, finished{0};
  for (int i = 0; i < kCalls; ++i) {
    req[i].set_member_token(member.member_token());
    req[i].set_op(v1::GroupStoreRequest::OP_WAIT);
    req[i].add_keys("never-yet");
    req[i].set_wait_ms(20000);
    stub->async()->Store(&ctx[i], &req[i], &resp[i], [&, i](grpc::Status s) {
      if (s.ok() && resp[i].ready()) ++ready;
      ++finished;
    });
  }
  ASSERT_TRUE(asympo::testing::WaitFor([&] { return group_->waiting_calls() == kCalls; }))
      << group_->waiting_calls();
  EXPECT_LT(Threads(), threads_before + 40) << "threads while " << kCalls << " calls wait";
  v1::GroupStoreResponse store;
  grpc::Status refused = StoreOp(*stub, member.member_token(), v1::GroupStoreRequest::OP_WAIT,
                                 {"never-yet"}, &store);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("200 calls waiting"));
  EXPECT_EQ(asympo::testing::MetricValue(metrics_.registry, "test_refusals_total", "waiting_calls"),
            1);
  // The key is set (the member's rendezvous is still pending): every
  // parked wait answers ready.
  ASSERT_TRUE(
      StoreOp(*stub, member.member_token(), v1::GroupStoreRequest::OP_SET, {"never-yet"}, &store)
          .ok());
  EXPECT_TRUE(asympo::testing::WaitFor([&] { return finished.load() == kCalls; }));
  EXPECT_EQ(ready.load(), kCalls);
  EXPECT_EQ(group_->waiting_calls(), 0);
}

TEST_F(WeightGroupTest, EveryCallNeedsTheReadWeightsRole) {
  for (const char* token : {"", "gen-tok"}) {
    auto stub = Stub(token);
    v1::JoinGroupResponse join;
    v1::GroupStoreResponse store;
    v1::GroupNextResponse next;
    const grpc::StatusCode want =
        *token == '\0' ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::PERMISSION_DENIED;
    EXPECT_EQ(Join(*stub, "w", &join).error_code(), want) << token;
    EXPECT_EQ(StoreOp(*stub, "t", v1::GroupStoreRequest::OP_SET, {"k"}, &store).error_code(), want);
    EXPECT_EQ(Next(*stub, "t", &next).error_code(), want);
  }
  EXPECT_EQ(group_->generation(), 0u);
}

TEST_F(WeightGroupTest, AMemberThatNeverConnectsEndsItsGenerationNotTheGroup) {
  auto stub = Stub();
  v1::JoinGroupResponse first;
  ASSERT_TRUE(Join(*stub, "engine-0", &first).ok());
  ASSERT_TRUE(first.formed());
  EXPECT_EQ(first.generation(), 1u);
  EXPECT_EQ(first.rank(), 1u);
  EXPECT_EQ(first.world_size(), 2u);
  EXPECT_EQ(first.backend(), "gloo");
  EXPECT_EQ(first.timeout_ms(), 500u);
  // The store of its generation answers while the rendezvous waits.
  v1::GroupStoreResponse store;
  ASSERT_TRUE(
      StoreOp(*stub, first.member_token(), v1::GroupStoreRequest::OP_SET, {"mine"}, &store).ok());
  ASSERT_TRUE(
      StoreOp(*stub, first.member_token(), v1::GroupStoreRequest::OP_GET, {"mine"}, &store).ok());
  EXPECT_TRUE(store.ready());
  EXPECT_EQ(store.value(), "v");
  ASSERT_TRUE(
      StoreOp(*stub, first.member_token(), v1::GroupStoreRequest::OP_CHECK, {"absent"}, &store)
          .ok());
  EXPECT_FALSE(store.ready());

  // It never builds its process group: the rendezvous times out, the
  // failure is counted, and its token is told to join again.
  EXPECT_TRUE(asympo::testing::WaitFor([&] { return Failures("rendezvous") >= 1; }));
  v1::GroupNextResponse next;
  EXPECT_TRUE(asympo::testing::WaitFor([&] {
    return Next(*stub, first.member_token(), &next).ok() &&
           next.action() == v1::GroupNextResponse::ACTION_REJOIN;
  }));
  EXPECT_TRUE(asympo::testing::WaitFor([&] {
    grpc::Status s =
        StoreOp(*stub, first.member_token(), v1::GroupStoreRequest::OP_SET, {"k"}, &store);
    return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  }));

  // The group goes on: the worker joins a later generation.
  v1::JoinGroupResponse again;
  ASSERT_TRUE(asympo::testing::WaitFor(
      [&] { return Join(*stub, "engine-0", &again).ok() && again.formed(); }));
  EXPECT_GT(again.generation(), first.generation());
  EXPECT_NE(again.member_token(), first.member_token());
  EXPECT_EQ(again.world_size(), 2u);
}

TEST_F(WeightGroupTest, ANewerJoinUnderTheSameIdTakesTheWaitingOnesPlace) {
  // Keep a generation busy connecting, so that later Joins wait.
  auto stub = Stub();
  v1::JoinGroupResponse first;
  ASSERT_TRUE(Join(*stub, "engine-0", &first).ok());
  grpc::Status older;
  v1::JoinGroupResponse older_reply;
  std::thread waiting([&] {
    grpc::ClientContext ctx;
    v1::JoinGroupRequest r;
    r.set_worker_id("engine-1");
    r.set_backend("gloo");
    r.set_wait_ms(200);
    older = Stub()->Join(&ctx, r, &older_reply);
  });
  absl::SleepFor(absl::Milliseconds(50));
  v1::JoinGroupResponse newer;
  grpc::Status s = Join(*stub, "engine-1", &newer);
  waiting.join();
  EXPECT_TRUE(s.ok()) << s.error_message();
  // The first generation was still connecting (its rendezvous waits 500
  // ms for engine-0), so no generation could take the older Join first.
  EXPECT_EQ(older.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(older.error_message(), HasSubstr("newer Join for worker engine-1"));
  EXPECT_TRUE(newer.formed());
}

TEST(WeightGroupOptionsTest, BadOptionsAreRefused) {
  prometheus::Registry registry;
  SnapshotStore store({}, "sig-1", registry);
  WeightGroupOptions o;
  o.backend = "tcp";
  EXPECT_THAT(
      WeightGroup::Create(o, store, registry),
      asympo::testing::StatusIs(absl::StatusCode::kInvalidArgument, "neither gloo nor nccl"));
  o.backend = "gloo";
  o.timeout = absl::ZeroDuration();
  EXPECT_THAT(WeightGroup::Create(o, store, registry),
              asympo::testing::StatusIs(absl::StatusCode::kInvalidArgument, "positive"));
}

}  // namespace
}  // namespace asympo::broadcast
