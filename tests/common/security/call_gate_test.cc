// The call gate: callers refused on their headers, before the service sees
// the call, over gRPC's local credentials (plaintext on the wire); the
// authorizer's metadata check and the share keys.
#include "common/security/call_gate.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/security/authorizer.h"
#include "common/security/x509.h"
#include "tests/testing/authorizer_metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::security {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// What the test authorizers count into: it outlives them all.
testing::AuthorizerMetrics& Metrics() {
  static auto* const metrics = new testing::AuthorizerMetrics;
  return *metrics;
}

std::unique_ptr<Authorizer> TokenAuthorizer(testing::ScopedTempDir& dir) {
  std::ofstream(dir.Path("p.json"))
      << absl::StrCat("{\"principals\": [{\"name\": \"gen\", \"token_sha256\": \"",
                      Sha256Hex("gen-token"), "\", \"roles\": [\"submit\"]}]}");
  AuthOptions o;
  o.principals_file = dir.Path("p.json");
  auto a = Authorizer::Create(o, Metrics().refusals, Metrics().registry);
  EXPECT_OK(a);
  return *std::move(a);
}

TEST(CallGateTest, AuthenticateChecksTheHeaderAlone) {
  testing::ScopedTempDir dir("gate");
  std::unique_ptr<Authorizer> a = TokenAuthorizer(dir);
  const absl::string_view good = "Bearer gen-token", bad = "Bearer nope", odd = "Basic x";
  auto p = a->Authenticate(&good, nullptr);
  ASSERT_OK(p);
  EXPECT_EQ((*p)->name, "gen");
  EXPECT_THAT(a->Authenticate(&bad, nullptr).status().message(), HasSubstr("not one"));
  EXPECT_THAT(a->Authenticate(&odd, nullptr), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(a->Authenticate(nullptr, nullptr).status().message(), HasSubstr("no credentials"));
}

TEST(CallGateTest, PeerAddressDropsThePort) {
  EXPECT_EQ(PeerAddress("ipv4:10.0.0.7:40312"), "10.0.0.7");
  EXPECT_EQ(PeerAddress("ipv6:[::1]:40312"), "::1");
  EXPECT_EQ(PeerAddress("ipv6:[fe80::1%2]:5"), "fe80::1%2");
  EXPECT_EQ(PeerAddress("unix:/tmp/s"), "unix:/tmp/s");
}

// Counts the calls that reach the service; answers UNIMPLEMENTED.
class CountingService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    ++calls;
    return grpc::CallbackGenericService::CreateReactor(ctx);
  }
  std::atomic<int> calls{0};
};

grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice slice(std::string(1 << 20, 'x'));  // a message the service must never see
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/asympo.test.Any/Call", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

TEST(CallGateTest, RefusesOnTheHeadersOverLoopbackPlaintext) {
  testing::ScopedTempDir dir("gate");
  std::unique_ptr<Authorizer> a = TokenAuthorizer(dir);
  std::shared_ptr<grpc::ServerCredentials> creds =
      GateCallsOnMetadata(grpc::InsecureServerCredentials(), /*tls=*/false, "127.0.0.1:0", a.get());
  CountingService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", creds, &port);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  // A plaintext client, as before: local credentials send nothing more.
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::Status s = Call(channel, "");
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::UNAUTHENTICATED, "no credentials"));
  s = Call(channel, "wrong");
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(service.calls.load(), 0) << "refused calls never reach the service";
  s = Call(channel, "gen-token");
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::UNIMPLEMENTED));
  EXPECT_EQ(service.calls.load(), 1);
  server->Shutdown();
}

TEST(CallGateTest, LeavesAnOpenLearnerAlone) {
  testing::ScopedTempDir dir("gate");
  auto open = Authorizer::Create(AuthOptions(), Metrics().refusals, Metrics().registry);
  ASSERT_OK(open);
  auto insecure = grpc::InsecureServerCredentials();
  EXPECT_EQ(GateCallsOnMetadata(insecure, false, "127.0.0.1:0", open->get()), insecure);
  EXPECT_EQ(GateCallsOnMetadata(insecure, false, "127.0.0.1:0", nullptr), insecure);
  std::unique_ptr<Authorizer> tokens = TokenAuthorizer(dir);
  // Plaintext beyond loopback (--insecure): no gate, the handlers check.
  EXPECT_EQ(GateCallsOnMetadata(insecure, false, "0.0.0.0:0", tokens.get()), insecure);
}

}  // namespace
}  // namespace asympo::security
