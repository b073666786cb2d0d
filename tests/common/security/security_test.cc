// Certificates, the listening policy and the principals file, with
// certificates made by openssl for the test.
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/listener/host_port.h"
#include "common/security/authorizer.h"
#include "common/security/principals_file.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "tests/testing/authorizer_metrics.h"
#include "tests/testing/certs.h"
#include "tests/testing/metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::security {
namespace {

using ::asympo::testing::MetricValue;
using ::asympo::testing::StatusIs;
using ::asympo::testing::TestCertificates;
using ::testing::HasSubstr;

std::string Cert(const std::string& name) { return TestCertificates::Path(name); }

std::string Read(const std::string& path) {
  auto text = ReadSecretFile(path, "test file");
  return text.ok() ? *text : "";
}

TEST(SecurityTest, Sha256HexMatchesTheStandardVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(SecurityTest, KeyPairsAreCheckedAtStart) {
  EXPECT_OK(CheckKeyPair(Cert("server.pem"), Cert("server.key")));
  EXPECT_THAT(CheckKeyPair(Cert("server.pem"), Cert("other.key")).message(),
              HasSubstr("is not the key of certificate"));
  EXPECT_THAT(CheckKeyPair(Cert("expired.pem"), Cert("expired.key")).message(),
              HasSubstr("expired on Jan  2 00:00:00 2020 GMT"));
  EXPECT_THAT(CheckKeyPair(Cert("missing.pem"), Cert("server.key")).message(),
              HasSubstr("missing.pem cannot be read"));
  EXPECT_THAT(CheckKeyPair(Cert("server.key"), Cert("server.key")).message(),
              HasSubstr("holds no PEM certificate"));
}

TEST(SecurityTest, TheCaVerifiesClientCertificates) {
  ASSERT_OK_AND_ASSIGN(auto ca, CertificateAuthority::Load(Cert("ca.pem")));
  const absl::Time now = absl::Now();
  ASSERT_OK_AND_ASSIGN(auto good, ca->Verify(Read(Cert("client.pem")), "", now));
  EXPECT_EQ(good.common_name, "rollout-1");
  EXPECT_THAT(ca->Verify(Read(Cert("rogue.pem")), "", now),
              StatusIs(absl::StatusCode::kUnauthenticated, "not trusted"));
  auto expired = ca->Verify(Read(Cert("expired.pem")), "", now);
  EXPECT_THAT(expired.status().message(), HasSubstr("expired on Jan  2 00:00:00 2020 GMT"));
  EXPECT_THAT(ca->Verify("not a certificate", "", now), ::testing::Not(asympo::testing::IsOk()));
  // The server's certificate is not for clients (extendedKeyUsage).
  EXPECT_THAT(ca->Verify(Read(Cert("server.pem")), "", now),
              ::testing::Not(asympo::testing::IsOk()));
}

TEST(SecurityTest, LoopbackAddresses) {
  for (const char* a :
       {"127.0.0.1:50051", "127.1.2.3:1", "localhost:80", "[::1]:9", "::1", "LOCALHOST:1"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:1", "10.0.0.1:5", "learner:50051", "128.0.0.1:1",
                        "[2001:db8::1]:4", ""}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(SecurityTest, NothingListensBeyondLoopbackInPlaintextUnlessSaidSo) {
  EXPECT_OK(CheckListenPolicy("127.0.0.1:1", false, false, false));
  const absl::Status plain = CheckListenPolicy("0.0.0.0:50051", false, false, false);
  EXPECT_THAT(plain, StatusIs(absl::StatusCode::kFailedPrecondition, "--tls_cert"));
  EXPECT_THAT(plain.message(), HasSubstr("--insecure"));
  EXPECT_THAT(CheckListenPolicy("0.0.0.0:50051", true, false, false).message(),
              HasSubstr("without client authentication"));
  EXPECT_OK(CheckListenPolicy("0.0.0.0:50051", true, true, false));
  EXPECT_OK(CheckListenPolicy("0.0.0.0:50051", false, false, true));
}

TEST(SecurityTest, ServerCredentialsNameTheBadFlag) {
  prometheus::Registry registry;
  ServerTlsOptions o;
  o.cert_file = Cert("server.pem");
  EXPECT_THAT(MakeServerCredentials(o, registry).status().message(), HasSubstr("go together"));
  o.key_file = Cert("other.key");
  EXPECT_THAT(MakeServerCredentials(o, registry).status().message(),
              HasSubstr("--tls_cert/--tls_key"));
  o.key_file = Cert("server.key");
  EXPECT_OK(MakeServerCredentials(o, registry));
  o.client_ca_file = Cert("server.key");
  EXPECT_THAT(MakeServerCredentials(o, registry).status().message(), HasSubstr("--tls_client_ca"));
  ServerTlsOptions ca_only;
  ca_only.client_ca_file = Cert("ca.pem");
  EXPECT_THAT(MakeServerCredentials(ca_only, registry), ::testing::Not(asympo::testing::IsOk()));
}

TEST(SecurityTest, ClientChannelsRefuseTokensInPlaintextBeyondLoopback) {
  testing::ScopedTempDir dir("token");
  std::ofstream(dir.Path("token")) << "s3cret-token\n";
  prometheus::Registry registry;
  ClientTlsOptions o;
  o.token_file = dir.Path("token");
  EXPECT_OK(CreateClientChannel("127.0.0.1:1", o, registry));
  EXPECT_THAT(CreateClientChannel("10.1.2.3:1", o, registry),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  o.insecure = true;
  EXPECT_OK(CreateClientChannel("10.1.2.3:1", o, registry));
  o.token_file = dir.Path("absent");
  EXPECT_THAT(CreateClientChannel("127.0.0.1:1", o, registry).status().message(),
              HasSubstr("--tls_token_file"));
  ClientTlsOptions cert_without_ca;
  cert_without_ca.cert_file = Cert("client.pem");
  cert_without_ca.key_file = Cert("client.key");
  EXPECT_THAT(CreateClientChannel("127.0.0.1:1", cert_without_ca, registry).status().message(),
              HasSubstr("--tls_ca"));
}

std::string Principals(const std::string& entries) {
  return absl::StrCat("{\"principals\": [", entries, "]}");
}

TEST(SecurityTest, PrincipalsFileIsParsedAndCheckedEntryByEntry) {
  PrincipalDefaults d;
  d.queue_share = 0.5;
  const std::string hash = Sha256Hex("tok");
  ASSERT_OK_AND_ASSIGN(
      PrincipalTable ok,
      ParsePrincipals(
          Principals(absl::StrCat(R"({"name": "a", "token_sha256": ")", absl::AsciiStrToUpper(hash),
                                  R"(", "roles": ["submit", "status"], "groups_per_second": 5},)",
                                  R"({"name": "b", "certificate": "rollout-1",)",
                                  R"( "roles": ["read_weights"], "queue_share": 0.25})")),
          d));
  ASSERT_EQ(ok.principals.size(), 2u);
  EXPECT_EQ(ok.principals[0]->name, "a");
  EXPECT_TRUE(ok.principals[0]->Has(Role::kSubmit));
  EXPECT_FALSE(ok.principals[0]->Has(Role::kReadWeights));
  EXPECT_EQ(ok.principals[0]->queue_share, 0.5);
  EXPECT_EQ(ok.principals[0]->groups_per_second, 5);
  EXPECT_EQ(ok.principals[1]->queue_share, 0.25);
  // Found by the lowercase hash of the token, and by the certificate name.
  ASSERT_EQ(ok.by_token_hash.size(), 1u);
  EXPECT_EQ(ok.by_token_hash.at(hash), ok.principals[0].get());
  ASSERT_EQ(ok.by_certificate.size(), 1u);
  EXPECT_EQ(ok.by_certificate.at("rollout-1"), ok.principals[1].get());
  const std::pair<std::string, std::string> bad[] = {
      {R"({"name": "a", "token_sha256": "abc", "roles": ["submit"]})", "64 hex digits"},
      {R"({"name": "a", "certificate": "x", "roles": ["admin"]})", "unknown role \"admin\""},
      {R"({"name": "a b", "certificate": "x", "roles": ["submit"]})", "name must be"},
      {R"({"name": "a", "roles": ["submit"]})", "give token_sha256, certificate or both"},
      {R"({"name": "a", "certificate": "x", "roles": ["submit"], "queue_share": 0})",
       "queue_share must be in (0, 1]"},
      {R"({"name": "a", "certificate": "x", "roles": ["submit"], "rate": 1})",
       "unknown key \"rate\""},
      {R"({"name": "a", "certificate": "x", "roles": []})", "non-empty list"},
      {R"({"name": "a", "certificate": "x", "roles": ["submit"]},)"
       R"({"name": "a", "certificate": "y", "roles": ["submit"]})",
       "is named twice"},
      {R"({"name": "a", "certificate": "x", "roles": ["submit"]},)"
       R"({"name": "b", "certificate": "x", "roles": ["submit"]})",
       "its certificate is another's too"},
  };
  for (const auto& [entries, message] : bad) {
    EXPECT_THAT(ParsePrincipals(Principals(entries), d),
                StatusIs(absl::StatusCode::kInvalidArgument, message))
        << entries;
  }
  EXPECT_THAT(ParsePrincipals("[]", d), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePrincipals("{not json", d), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SecurityTest, AuthorizerRefusesAnEmptyPrincipalsFile) {
  testing::ScopedTempDir dir("auth");
  std::ofstream(dir.Path("p.json")) << Principals("");
  testing::AuthorizerMetrics metrics;
  AuthOptions o;
  o.principals_file = dir.Path("p.json");
  EXPECT_THAT(Authorizer::Create(o, metrics.refusals, metrics.registry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       dir.Path("p.json") + ": no principals: nobody could call"));
  o.principals_file = dir.Path("absent.json");
  EXPECT_THAT(Authorizer::Create(o, metrics.refusals, metrics.registry).status().message(),
              HasSubstr("cannot be read"));
  std::ofstream(dir.Path("bad.json")) << Principals(R"({"name": "a", "roles": ["submit"]})");
  o.principals_file = dir.Path("bad.json");
  EXPECT_THAT(
      Authorizer::Create(o, metrics.refusals, metrics.registry),
      StatusIs(absl::StatusCode::kInvalidArgument,
               dir.Path("bad.json") + ": principal \"a\": give token_sha256, certificate or both"));
}

// Refusals are counted in the family the caller gives, by code and cause,
// and so are those made elsewhere (a quota).
TEST(SecurityTest, AuthorizerCountsRefusalsInTheFamilyItIsGiven) {
  testing::ScopedTempDir dir("auth");
  std::ofstream(dir.Path("p.json"))
      << Principals(absl::StrCat(R"({"name": "gen", "token_sha256": ")", Sha256Hex("gen-token"),
                                 R"(", "roles": ["submit"]})"));
  testing::AuthorizerMetrics metrics;
  AuthOptions o;
  o.principals_file = dir.Path("p.json");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Authorizer> a,
                       Authorizer::Create(o, metrics.refusals, metrics.registry));
  const absl::string_view bad = "Bearer nope";
  EXPECT_THAT(a->Authenticate(&bad, nullptr), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(a->Authenticate(nullptr, nullptr), StatusIs(absl::StatusCode::kUnauthenticated));
  a->CountRefusal("RESOURCE_EXHAUSTED", "rate");
  EXPECT_EQ(MetricValue(metrics.registry, "test_refusals_total", "bad_token"), 1);
  EXPECT_EQ(MetricValue(metrics.registry, "test_refusals_total", "missing_credentials"), 1);
  EXPECT_EQ(MetricValue(metrics.registry, "test_refusals_total", "rate"), 1);
  EXPECT_EQ(MetricValue(metrics.registry, "test_refusals_total", "UNAUTHENTICATED"), 1);
}

}  // namespace
}  // namespace asympo::security
