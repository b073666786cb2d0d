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

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"
#include "common/collective/collective_group.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "tests/testing/authorizer_metrics.h"
#include "tests/testing/group_worker.h"
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
                        R"({"name": "outsider", "token_sha256": ")", security::Sha256Hex("out-tok"),
                        R"(", "roles": ["read_weights"]},)", R"({"name": "gen", "token_sha256": ")",
                        security::Sha256Hex("gen-tok"), R"(", "roles": ["submit"]}]})");
    for (const char* t : {"engine-tok", "out-tok", "gen-tok"}) std::ofstream(dir_.Path(t)) << t;
    security::AuthOptions auth;
    auth.principals_file = dir_.Path("principals.json");
    auto authorizer = security::Authorizer::Create(auth, metrics_.refusals, metrics_.registry);
    ASSERT_OK(authorizer);
    authorizer_ = *std::move(authorizer);
    WeightGroupOptions o = options_;
    o.timeout = timeout_;
    o.authorizer = authorizer_.get();
    o.received_bytes = &received_;
    store_ = std::make_unique<SnapshotStore>(SnapshotStoreOptions{}, signature_, registry_);
    auto group = WeightGroup::Create(o, *store_, registry_);
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
                    const std::string& backend = "gloo", const std::string& signature = "",
                    grpc::ClientContext* context = nullptr) {
    grpc::ClientContext own;
    grpc::ClientContext& ctx = context != nullptr ? *context : own;
    v1::JoinGroupRequest r;
    r.set_worker_id(id);
    r.set_backend(backend);
    r.set_model_signature(signature.empty() ? signature_ : signature);
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
  // The group's options (the timeout apart), which a derived fixture may
  // change in its constructor.
  static WeightGroupOptions DefaultOptions() {
    WeightGroupOptions o;
    o.ready_timeout = absl::Seconds(1);
    o.join_window = absl::Milliseconds(100);
    o.max_waiting = 300;
    o.max_waiting_per_caller = 200;
    o.max_waiting_per_member = 250;
    return o;
  }
  WeightGroupOptions options_ = DefaultOptions();
  absl::Duration timeout_ = absl::Milliseconds(500);  // the rendezvous's
  std::string signature_ = "sig-1";                   // the learner's model
  std::atomic<int64_t> received_{0};
  prometheus::Registry registry_;
  std::unique_ptr<SnapshotStore> store_;  // what the group broadcasts
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
    grpc::Status s = asympo::testing::RawUnaryCall(Channel(), "/asympo.v1.WeightGroup/" + call,
                                                   std::string("\x0a\x7f\x01\x02", 4));
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
  grpc::Status refused =
      StoreOp(*stub, member.member_token(), v1::GroupStoreRequest::OP_WAIT, {"never-yet"}, &store);
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
  std::string older_reason;
  std::thread waiting([&] {
    grpc::ClientContext ctx;
    v1::JoinGroupRequest r;
    r.set_worker_id("engine-1");
    r.set_backend("gloo");
    r.set_model_signature("sig-1");
    r.set_wait_ms(200);
    older = Stub()->Join(&ctx, r, &older_reply);
    for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
      if (k == "asympo-abort-reason") older_reason = std::string(v.data(), v.size());
    }
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
  EXPECT_EQ(older_reason, "join_replaced") << "clients tell a takeover from other ABORTED answers";
  EXPECT_TRUE(newer.formed());
}

// --- Limits: what one member or principal can hold. ---

// Requests that break a field's rule name the field (never INTERNAL).
TEST_F(WeightGroupTest, MalformedFieldsAreRefusedNamingTheField) {
  auto stub = Stub();
  v1::JoinGroupResponse join;
  grpc::ClientContext join_ctx;
  v1::JoinGroupRequest unsigned_join;
  unsigned_join.set_worker_id("w");
  unsigned_join.set_backend("gloo");
  grpc::Status s = stub->Join(&join_ctx, unsigned_join, &join);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("model_signature"));
  v1::GroupStoreResponse store;
  s = StoreOp(*stub, "", v1::GroupStoreRequest::OP_SET, {"k"}, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("member_token"));
  s = StoreOp(*stub, "t", v1::GroupStoreRequest::OP_UNSPECIFIED, {"k"}, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("op must name"));
  s = StoreOp(*stub, std::string(65, 't'), v1::GroupStoreRequest::OP_SET, {"k"}, &store);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("member_token"));
  v1::GroupNextResponse next;
  s = Next(*stub, "", &next);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("member_token"));
  // A worker_id that is not UTF-8 (field 1 of JoinGroupRequest).
  s = asympo::testing::RawUnaryCall(Channel(), "/asympo.v1.WeightGroup/Join",
                                    std::string("\x0a\x02\xff\xfe", 4));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(s.error_message().empty());
  EXPECT_EQ(group_->generation(), 0u);
}

// Worker ids belong to the principal that joined them first; one principal
// holds a bounded number of them.
class WeightGroupIdsTest : public WeightGroupTest {
 protected:
  WeightGroupIdsTest() { options_.max_worker_ids_per_principal = 2; }
};

TEST_F(WeightGroupIdsTest, WorkerIdsAreBoundToTheirPrincipalAndBounded) {
  auto engine = Stub();
  v1::JoinGroupResponse mine;
  ASSERT_TRUE(Join(*engine, "engine-0", &mine).ok());
  ASSERT_TRUE(mine.formed());
  auto outsider = Stub("out-tok");
  v1::JoinGroupResponse theirs;
  grpc::Status s = Join(*outsider, "engine-0", &theirs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("\"engine-0\" is bound to another principal"));
  EXPECT_EQ(asympo::testing::MetricValue(metrics_.registry, "test_refusals_total", "worker_owner"),
            1);
  // Two ids of its own, not a third.
  for (const char* id : {"x-1", "x-2"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    v1::JoinGroupRequest r;
    r.set_worker_id(id);
    r.set_backend("gloo");
    r.set_model_signature("sig-1");
    r.set_wait_ms(10);
    (void)outsider->Join(&ctx, r, &theirs);
  }
  s = Join(*outsider, "x-3", &theirs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("holds 2 worker ids"));
  EXPECT_EQ(asympo::testing::MetricValue(metrics_.registry, "test_refusals_total", "worker_ids"),
            1);
}

// A store whose rendezvous waits long enough to fill it, with small limits.
class WeightGroupStoreLimitsTest : public WeightGroupTest {
 protected:
  WeightGroupStoreLimitsTest() {
    timeout_ = absl::Seconds(2);
    options_.max_store_bytes = 3000;
    options_.max_store_bytes_per_member = 2000;
    options_.max_store_keys_per_member = 4;
    options_.max_waiting_per_member = 3;
  }
  void Set(v1::WeightGroup::Stub& stub, const std::string& token, const std::string& key,
           size_t bytes, grpc::Status* status) {
    grpc::ClientContext ctx;
    v1::GroupStoreRequest r;
    r.set_member_token(token);
    r.set_op(v1::GroupStoreRequest::OP_SET);
    r.add_keys(key);
    r.set_value(std::string(bytes, 'v'));
    v1::GroupStoreResponse out;
    *status = stub.Store(&ctx, r, &out);
  }
};

TEST_F(WeightGroupStoreLimitsTest, TheStoreHoldsWhatMembersSetWithinItsLimits) {
  auto stub = Stub();
  v1::JoinGroupResponse a, b;
  std::thread other([&] { ASSERT_TRUE(Join(*Stub(), "engine-1", &b).ok()); });
  ASSERT_TRUE(Join(*stub, "engine-0", &a).ok());
  other.join();
  ASSERT_TRUE(a.formed() && b.formed());
  ASSERT_EQ(a.generation(), b.generation());
  grpc::Status s;
  Set(*stub, a.member_token(), "a/0", 1500, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // A member's bytes.
  Set(*stub, a.member_token(), "a/1", 600, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("worker \"engine-0\" would hold 2106 bytes"));
  // Replacing its own key counts the new value only.
  Set(*stub, a.member_token(), "a/0", 1900, &s);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // The generation's bytes.
  Set(*stub, b.member_token(), "b/0", 1500, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("the generation would hold 3406 bytes"));
  EXPECT_EQ(asympo::testing::MetricValue(metrics_.registry, "test_refusals_total", "store_bytes"),
            2);
  // A member's keys.
  for (const char* k : {"b/1", "b/2", "b/3", "b/4"}) {
    Set(*stub, b.member_token(), k, 1, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  Set(*stub, b.member_token(), "b/5", 1, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("would hold 5 keys"));
  // Another member's key is not this one's to set or delete.
  Set(*stub, b.member_token(), "a/0", 1, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("\"a/0\" was set by another rank"));
  // A member's waiting calls.
  std::vector<grpc::ClientContext> ctx(3);
  std::vector<v1::GroupStoreRequest> req(3);
  std::vector<v1::GroupStoreResponse> resp(3);
  std::atomic<int> finished{0};
  for (int i = 0; i < 3; ++i) {
    req[i].set_member_token(b.member_token());
    req[i].set_op(v1::GroupStoreRequest::OP_WAIT);
    req[i].add_keys("never");
    req[i].set_wait_ms(300);
    stub->async()->Store(&ctx[i], &req[i], &resp[i], [&](grpc::Status) { ++finished; });
  }
  ASSERT_TRUE(asympo::testing::WaitFor([&] { return group_->waiting_calls() == 3; }));
  v1::GroupStoreResponse out;
  s = StoreOp(*stub, b.member_token(), v1::GroupStoreRequest::OP_WAIT, {"never"}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("this member has 3 calls waiting"));
  EXPECT_EQ(asympo::testing::MetricValue(metrics_.registry, "test_refusals_total",
                                         "member_waiting_calls"),
            1);
  // The other member's calls are not held back by it.
  s = StoreOp(*stub, a.member_token(), v1::GroupStoreRequest::OP_CHECK, {"never"}, &out);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(asympo::testing::WaitFor([&] { return finished.load() == 3; }));
}

// --- Membership: a newcomer cannot stop the members. ---

std::vector<TensorSpec> Specs() { return {{"w", v1::DTYPE_F32, {256}}}; }

// A group whose members really connect (Gloo) and receive versions.
class WeightGroupTrialTest : public WeightGroupTest {
 protected:
  WeightGroupTrialTest() {
    timeout_ = absl::Seconds(3);
    options_.ready_timeout = absl::Seconds(5);
    options_.rendezvous_backoff = absl::Seconds(30);
    signature_ = ModelSignature(Specs());
  }
  void Publish(uint64_t version) {
    std::vector<float> w(256, static_cast<float>(version));
    ASSERT_OK(store_->Publish(version, {{Specs()[0], w.data(), w.size() * sizeof(float)}}));
  }
  // Joins as `id` and builds its Gloo process group; then, on its own
  // thread, asks for versions and receives them until told to join again
  // or stop_ is set.
  void StartMember(const std::string& id) {
    auto stub = Stub();
    v1::JoinGroupResponse joined;
    ASSERT_TRUE(
        asympo::testing::WaitFor([&] { return Join(*stub, id, &joined).ok() && joined.formed(); }));
    auto store = c10::make_intrusive<asympo::testing::RpcStore>(Channel(), joined.member_token(),
                                                                std::chrono::seconds(3));
    auto pg = collective::NewGlooGroup(store, static_cast<int>(joined.rank()),
                                       static_cast<int>(joined.world_size()),
                                       std::chrono::seconds(3), "127.0.0.1");
    member_ = std::thread([this, stub = std::move(stub), pg, token = joined.member_token()] {
      uint64_t held = 0;
      while (!stop_.load()) {
        v1::GroupNextResponse next;
        grpc::ClientContext ctx;
        v1::GroupNextRequest r;
        r.set_member_token(token);
        r.set_held_version(held);
        r.set_held_incarnation(held == 0 ? "" : incarnation_);
        r.set_wait_ms(100);
        if (!stub->Next(&ctx, r, &next).ok()) continue;
        if (next.action() == v1::GroupNextResponse::ACTION_REJOIN) {
          told_to_rejoin_ = true;
          return;
        }
        if (next.action() != v1::GroupNextResponse::ACTION_RECEIVE) continue;
        incarnation_ = next.manifest().incarnation();
        for (const v1::BucketInfo& b : next.manifest().buckets()) {
          if (b.size_bytes() == 0) continue;
          std::vector<at::Tensor> t{at::empty({static_cast<int64_t>(b.size_bytes())}, at::kByte)};
          c10d::BroadcastOptions o;
          o.rootRank = 0;
          pg->broadcast(t, o)->wait();
        }
        held = next.manifest().version();
        received_ = held;
      }
    });
  }
  void TearDown() override {
    stop_ = true;
    if (member_.joinable()) member_.join();
    WeightGroupTest::TearDown();
  }

  std::thread member_;
  std::atomic<bool> stop_{false}, told_to_rejoin_{false};
  std::atomic<uint64_t> received_{0};
  std::string incarnation_;
};

TEST_F(WeightGroupTrialTest, ANewcomerThatNeverConnectsDoesNotStopTheMembers) {
  StartMember("engine-0");
  const uint64_t gen = group_->generation();
  Publish(1);
  ASSERT_TRUE(asympo::testing::WaitFor([&] { return received_.load() == 1; }));
  // Another principal joins and never builds its process group.
  auto outsider = Stub("out-tok");
  v1::JoinGroupResponse theirs;
  ASSERT_TRUE(Join(*outsider, "x-1", &theirs).ok());
  ASSERT_TRUE(theirs.formed()) << "its trial";
  EXPECT_GT(theirs.generation(), gen);
  // Meanwhile the member goes on receiving in its generation.
  for (uint64_t v = 2; v <= 3; ++v) {
    Publish(v);
    ASSERT_TRUE(asympo::testing::WaitFor([&] { return received_.load() == v; })) << v;
  }
  EXPECT_EQ(group_->generation(), gen);
  EXPECT_EQ(Failures("rendezvous"), 0);
  // Its trial times out: it, and any new id of its principal, are kept out.
  ASSERT_TRUE(asympo::testing::WaitFor([&] { return Failures("trial_rendezvous") == 1; }));
  grpc::ClientContext ctx;
  grpc::Status s = Join(*outsider, "x-2", &theirs, "gloo", "", &ctx);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("failed a rendezvous of the weight group"));
  EXPECT_EQ(ctx.GetServerTrailingMetadata().count("asympo-retry-after-ms"), 1u);
  EXPECT_EQ(
      asympo::testing::MetricValue(metrics_.registry, "test_refusals_total", "rendezvous_backoff"),
      1);
  Publish(4);
  EXPECT_TRUE(asympo::testing::WaitFor([&] { return received_.load() == 4; }));
  EXPECT_EQ(group_->generation(), gen);
  EXPECT_FALSE(told_to_rejoin_.load());
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
