// The Learner service behind TLS, mTLS and bearer tokens, with roles and
// per-source quotas: a real gRPC server on loopback, real clients, and
// certificates made by openssl for the test.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "learner_server/admission/learner_service.h"
#include "learner_server/learner_metrics.h"
#include "tests/testing/certs.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/grpc_metadata.h"
#include "tests/testing/metrics.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::MetricValue;
using ::asympo::testing::RolloutBatchBuilder;
using ::asympo::testing::StatusIs;
using ::asympo::testing::TestCertificates;
using ::asympo::testing::Trailing;

// Groups "p0", "p1", ... of prompt {1}, two responses {3} rewarded 0 and 1.
v1::RolloutBatch SecureBatch(int groups) {
  return RolloutBatchBuilder(groups, 2)
      .PromptTokens([](int) { return std::vector<int32_t>{1}; })
      .ResponseTokens([](int, int) { return std::vector<int32_t>{3}; })
      .Build();
}

std::string ReadCert(const std::string& cert) {
  auto text = security::ReadSecretFile(TestCertificates::Path(cert), "test certificate");
  return text.ok() ? *text : "";
}

class LearnerServiceSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Tokens "gen-token" (submit and status, at most a quarter of the queue,
    // 8 groups a second), "reader-token" (read_weights only); the
    // certificate rollout-1 (every role).
    std::ofstream(dir_.Path("principals.json")) << absl::StrCat(
        R"({"principals": [)", R"({"name": "gen", "token_sha256": ")",
        security::Sha256Hex("gen-token"),
        R"(", "roles": ["submit", "status"], "queue_share": 0.25,)", R"( "groups_per_second": 8},)",
        R"({"name": "reader", "token_sha256": ")", security::Sha256Hex("reader-token"),
        R"(", "roles": ["read_weights"]},)", R"({"name": "rollouts", "certificate": "rollout-1",)",
        R"( "roles": ["submit", "read_weights", "status"]}]})");
    for (const char* t : {"gen-token", "reader-token", "wrong-token"}) {
      std::ofstream(dir_.Path(t)) << t << "\n";
    }
    security::AuthOptions auth;
    auth.principals_file = dir_.Path("principals.json");
    auth.client_ca_file = TestCertificates::Path("ca.pem");
    // The learner's own refusal family (asympo_learner_refusals_total).
    auto authorizer =
        security::Authorizer::Create(auth, RegisterRefusalCounters(registry_), registry_);
    ASSERT_OK(authorizer);
    authorizer_ = *std::move(authorizer);
    queue_ = std::make_unique<GroupQueue>(GroupQueueOptions{64, 64});
    LearnerServiceOptions o;
    o.limits.vocab_size = 100;
    o.limits.max_groups_per_batch = 4;
    o.full_queue_timeout = absl::Seconds(2);
    o.authorizer = authorizer_.get();
    o.received_bytes = &received_;
    o.clock = &clock_;  // rate windows pass when the test advances it
    service_ = std::make_unique<LearnerService>(o, queue_.get(), &counters_);
    security::ServerTlsOptions tls;
    tls.cert_file = TestCertificates::Path("server.pem");
    tls.key_file = TestCertificates::Path("server.key");
    tls.client_ca_file = TestCertificates::Path("ca.pem");
    auto creds = security::MakeServerCredentials(tls, registry_);
    ASSERT_OK(creds);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    queue_->Close();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // A client with the test CA and, optionally, a token file and a client
  // certificate named by its file stem. The project's channels refuse to
  // present an expired certificate of their own, so that one goes through
  // gRPC's plain SSL credentials.
  std::unique_ptr<v1::Learner::Stub> Client(const std::string& token,
                                            const std::string& cert = "") {
    if (cert == "expired") {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = ReadCert("ca.pem");
      ssl.pem_cert_chain = ReadCert("expired.pem");
      ssl.pem_private_key = ReadCert("expired.key");
      return v1::Learner::NewStub(
          grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::SslCredentials(ssl)));
    }
    security::ClientTlsOptions o;
    o.ca_file = TestCertificates::Path("ca.pem");
    if (!token.empty()) o.token_file = dir_.Path(token);
    if (!cert.empty()) {
      o.cert_file = TestCertificates::Path(cert + ".pem");
      o.key_file = TestCertificates::Path(cert + ".key");
    }
    auto channel =
        security::CreateClientChannel("127.0.0.1:" + std::to_string(port_), o, client_registry_);
    EXPECT_OK(channel);
    return v1::Learner::NewStub(*channel);
  }

  grpc::Status Submit(v1::Learner::Stub* stub, int groups, grpc::ClientContext* ctx = nullptr) {
    grpc::ClientContext own;
    v1::SubmitResponse r;
    return stub->Submit(ctx ? ctx : &own, SecureBatch(groups), &r);
  }

  double Refusals(const std::string& cause) {
    return MetricValue(registry_, "asympo_learner_refusals_total", cause);
  }

  testing::ScopedTempDir dir_{"auth"};
  prometheus::Registry registry_;
  asympo::testing::FakeClock clock_;
  prometheus::Registry client_registry_;  // the clients' asympo_tls_*
  std::unique_ptr<security::Authorizer> authorizer_;
  LearnerCounters counters_;
  std::atomic<int64_t> received_{0};
  std::unique_ptr<GroupQueue> queue_;
  std::unique_ptr<LearnerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(LearnerServiceSecurityTest, KnownCallersInTheirRolesAreServed) {
  EXPECT_OK(Submit(Client("gen-token").get(), 2));
  EXPECT_OK(Submit(Client("", "client").get(), 2));
  grpc::ClientContext ctx;
  v1::LearnerStatus status;
  ASSERT_OK(Client("gen-token")->GetStatus(&ctx, v1::GetStatusRequest(), &status));
  EXPECT_EQ(status.accepted_groups(), 4u);
  EXPECT_EQ(status.limits().max_message_bytes(), int64_t{64} << 20);
  EXPECT_EQ(queue_->Stats().depth_groups, 4);
  EXPECT_EQ(queue_->HeldBySource(),
            (std::vector<std::pair<std::string, int64_t>>{{"gen", 2}, {"rollouts", 2}}));
}

TEST_F(LearnerServiceSecurityTest, EveryBadCredentialIsRefusedCountedAndQueuesNothing) {
  const struct {
    std::string token, cert;
    grpc::StatusCode code;
    std::string message, cause;
  } cases[] = {
      {"wrong-token", "", grpc::StatusCode::UNAUTHENTICATED, "not one the learner knows",
       "bad_token"},
      {"", "", grpc::StatusCode::UNAUTHENTICATED, "no credentials", "missing_credentials"},
      {"reader-token", "", grpc::StatusCode::PERMISSION_DENIED,
       "principal \"reader\" lacks the role submit", "role"},
      {"", "rogue", grpc::StatusCode::UNAUTHENTICATED, "not trusted", "bad_certificate"},
      {"", "expired", grpc::StatusCode::UNAUTHENTICATED, "expired on", "bad_certificate"},
      {"", "client2", grpc::StatusCode::UNAUTHENTICATED, "names no principal",
       "unknown_certificate"},
  };
  for (const auto& c : cases) {
    const double before = Refusals(c.cause);
    const int64_t received_before = received_.load();
    const grpc::Status s = Submit(Client(c.token, c.cert).get(), 2);
    EXPECT_THAT(s, StatusIs(c.code, c.message)) << c.token << c.cert;
    EXPECT_EQ(Refusals(c.cause) - (std::isnan(before) ? 0 : before), 1) << c.cause;
    // What gRPC received is counted all the same (its memory is released
    // like any other request's: common/daemon/heap_release.h).
    EXPECT_EQ(received_.load() - received_before,
              static_cast<int64_t>(SecureBatch(2).ByteSizeLong()))
        << c.cause;
  }
  // A client that does not trust the learner's CA never gets to call.
  security::ClientTlsOptions untrusting;
  untrusting.ca_file = TestCertificates::Path("rogue_ca.pem");
  auto channel = security::CreateClientChannel("127.0.0.1:" + std::to_string(port_), untrusting,
                                               client_registry_);
  ASSERT_OK(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_THAT(Submit(v1::Learner::NewStub(*channel).get(), 2, &ctx),
              StatusIs(grpc::StatusCode::UNAVAILABLE));
  // Plaintext to a TLS port fails too.
  auto plain = v1::Learner::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                        grpc::InsecureChannelCredentials()));
  grpc::ClientContext plain_ctx;
  plain_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_THAT(Submit(plain.get(), 2, &plain_ctx), StatusIs(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(queue_->Stats().depth_groups, 0);
  EXPECT_EQ(counters_.accepted_batches.load(), 0u);
  // GetStatus needs the role status.
  grpc::ClientContext status_ctx;
  v1::LearnerStatus status;
  EXPECT_THAT(Client("reader-token")->GetStatus(&status_ctx, {}, &status),
              StatusIs(grpc::StatusCode::PERMISSION_DENIED));
}

TEST_F(LearnerServiceSecurityTest, ASourceIsHeldToItsShareOfTheQueue) {
  // gen may hold 16 of 64 groups; its rate (8 a second, a burst of 8) is
  // spent first, so the clock moves on by the hint between batches.
  auto gen = Client("gen-token");
  int queued = 0;
  while (queued < 16) {
    grpc::ClientContext ctx;
    const grpc::Status s = Submit(gen.get(), 4, &ctx);
    if (s.ok()) {
      queued += 4;
      continue;
    }
    ASSERT_THAT(s, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "over its rate"));
    clock_.Advance(absl::Milliseconds(std::stoi(Trailing(ctx, "asympo-retry-after-ms"))));
  }
  clock_.Advance(absl::Seconds(1));  // the rate is not what refuses the next one
  grpc::ClientContext ctx;
  const grpc::Status full = Submit(gen.get(), 4, &ctx);
  EXPECT_THAT(full,
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "source \"gen\" holds 16 groups"));
  EXPECT_EQ(Trailing(ctx, "asympo-retry-after-ms"), "1000");
  EXPECT_EQ(Refusals("queue_share"), 1);
  // Another source is not held back by gen's share.
  EXPECT_OK(Submit(Client("", "client").get(), 4));
  // Once the learner trains some of gen's groups, gen may send again.
  ASSERT_EQ(queue_->Pop(8, absl::Now() + absl::Seconds(1)).size(), 8u);
  EXPECT_OK(Submit(gen.get(), 4));
  EXPECT_GE(counters_.rejected_quota_batches.load(), 1u);
}

TEST_F(LearnerServiceSecurityTest, ASourceIsHeldToItsRateWithARetryHint) {
  auto gen = Client("gen-token");
  EXPECT_OK(Submit(gen.get(), 4));
  EXPECT_OK(Submit(gen.get(), 4));  // the burst: 8 groups
  grpc::ClientContext ctx;
  const grpc::Status s = Submit(gen.get(), 4, &ctx);
  EXPECT_THAT(
      s, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "over its rate of 8 groups per second"));
  const int hint = std::stoi(Trailing(ctx, "asympo-retry-after-ms"));
  EXPECT_GT(hint, 0);
  EXPECT_LE(hint, 500);
  EXPECT_EQ(Refusals("rate"), 1);
  EXPECT_EQ(queue_->Stats().depth_groups, 8);
  clock_.Advance(absl::Milliseconds(hint - 1));
  EXPECT_THAT(Submit(gen.get(), 4),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "over its rate"));
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_OK(Submit(gen.get(), 4));
}

// What the queue does not take costs no rate: a duplicate (answered OK, not
// queued) and a batch the queue refuses give their groups back to the
// bucket, so that a generator retrying after a lost reply is not slowed.
TEST_F(LearnerServiceSecurityTest, GroupsTheQueueDoesNotTakeCostNoRate) {
  auto gen = Client("gen-token");
  v1::RolloutBatch b = SecureBatch(4);
  b.set_batch_id("gen/1");
  grpc::ClientContext first_ctx;
  v1::SubmitResponse first;
  ASSERT_OK(gen->Submit(&first_ctx, b, &first));
  grpc::ClientContext again_ctx;
  v1::SubmitResponse again;
  ASSERT_OK(gen->Submit(&again_ctx, b, &again));
  EXPECT_EQ(again.duplicate_batches(), 1u);
  // A stream that sends the same batch twice more: two duplicates.
  grpc::ClientContext stream_ctx;
  v1::SubmitResponse stream_reply;
  auto stream = gen->SubmitStream(&stream_ctx, &stream_reply);
  ASSERT_TRUE(stream->Write(b));
  ASSERT_TRUE(stream->Write(b));
  stream->WritesDone();
  ASSERT_OK(stream->Finish());
  EXPECT_EQ(stream_reply.duplicate_batches(), 2u);
  // Of the burst of 8, only the first batch's 4 were spent.
  grpc::ClientContext ctx;
  const grpc::Status s = Submit(gen.get(), 4, &ctx);
  EXPECT_OK(s);
  EXPECT_EQ(queue_->Stats().depth_groups, 8);
  EXPECT_TRUE(std::isnan(Refusals("rate")));
}

}  // namespace
}  // namespace asympo::learner

namespace asympo::learner {
namespace {

// A SubmitStream that sends nothing is closed after the idle timeout, and
// its place among the open streams is given back.
TEST(LearnerServiceLimitsTest, AnIdleSubmitStreamIsClosed) {
  GroupQueue queue(GroupQueueOptions{8, 8});
  LearnerCounters counters;
  LearnerServiceOptions o;
  o.limits.vocab_size = 100;
  o.stream_idle_timeout = absl::Milliseconds(300);
  LearnerService service(o, &queue, &counters);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  auto stub = v1::Learner::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::SubmitResponse r;
  auto writer = stub->SubmitStream(&ctx, &r);
  ASSERT_TRUE(writer->Write(SecureBatch(1)));  // active: not idle yet
  const absl::Time t0 = absl::Now();
  const grpc::Status s = writer->Finish();  // without WritesDone: the client idles
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::CANCELLED));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(queue.Stats().depth_groups, 1);  // what it sent stays accepted
  EXPECT_TRUE(
      asympo::testing::WaitFor([&] { return service.open_streams() == 0; }, absl::Seconds(2)));
  EXPECT_EQ(service.reaper().reaped(), 1);
  queue.Close();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace asympo::learner

namespace asympo::learner {
namespace {

// The certificate and key files are read again while the learner runs: a
// certificate replaced on disk is served from the next handshake on.
TEST(LearnerServiceTlsReloadTest, ARenewedCertificateIsServedWithoutARestart) {
  testing::ScopedTempDir dir("reload");
  const auto copy = [&](const std::string& from, const std::string& to) {
    std::ifstream in(TestCertificates::Path(from), std::ios::binary);
    std::ofstream(dir.Path(to + ".tmp"), std::ios::binary) << in.rdbuf();
    std::filesystem::rename(dir.Path(to + ".tmp"), dir.Path(to));  // atomically
  };
  copy("server.pem", "cert.pem");
  copy("server.key", "key.pem");
  GroupQueue queue(GroupQueueOptions{8, 8});
  LearnerCounters counters;
  LearnerServiceOptions o;
  o.limits.vocab_size = 100;
  LearnerService service(o, &queue, &counters);
  security::ServerTlsOptions tls;
  tls.cert_file = dir.Path("cert.pem");
  tls.key_file = dir.Path("key.pem");
  tls.reload_seconds = 1;
  prometheus::Registry registry, client_registry;
  auto creds = security::MakeServerCredentials(tls, registry);
  ASSERT_OK(creds);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *creds, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  // A fresh channel (a new handshake) trusting `ca`: whether GetStatus works.
  const auto served_for = [&](const std::string& ca) {
    security::ClientTlsOptions c;
    c.ca_file = TestCertificates::Path(ca);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // no connection reuse
    auto channel = security::CreateClientChannel("127.0.0.1:" + std::to_string(port), c,
                                                 client_registry, args);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::LearnerStatus status;
    return v1::Learner::NewStub(*channel)->GetStatus(&ctx, {}, &status).ok();
  };
  EXPECT_TRUE(served_for("ca.pem"));
  EXPECT_FALSE(served_for("rogue_ca.pem"));
  copy("server2.key", "key.pem");
  copy("server2.pem", "cert.pem");
  EXPECT_TRUE(
      asympo::testing::WaitFor([&] { return served_for("rogue_ca.pem"); }, absl::Seconds(15)));
  EXPECT_FALSE(served_for("ca.pem"));
  queue.Close();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace asympo::learner
