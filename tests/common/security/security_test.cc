// Certificates, the listening policy and the principals file, with
// certificates made by openssl for the test.
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/listener/host_port.h"
#include "common/security/authorizer.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "tests/testing/certs.h"
#include "tests/testing/temp_dir.h"

namespace asympo::security {
namespace {

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
  EXPECT_TRUE(CheckKeyPair(Cert("server.pem"), Cert("server.key")).ok());
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
  auto ca = CertificateAuthority::Load(Cert("ca.pem"));
  ASSERT_TRUE(ca.ok()) << ca.status();
  const absl::Time now = absl::Now();
  auto good = (*ca)->Verify(Read(Cert("client.pem")), "", now);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->common_name, "rollout-1");
  auto rogue = (*ca)->Verify(Read(Cert("rogue.pem")), "", now);
  EXPECT_EQ(rogue.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(rogue.status().message(), HasSubstr("not trusted"));
  auto expired = (*ca)->Verify(Read(Cert("expired.pem")), "", now);
  EXPECT_THAT(expired.status().message(), HasSubstr("expired on Jan  2 00:00:00 2020 GMT"));
  EXPECT_FALSE((*ca)->Verify("not a certificate", "", now).ok());
  // The server's certificate is not for clients (extendedKeyUsage).
  EXPECT_FALSE((*ca)->Verify(Read(Cert("server.pem")), "", now).ok());
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
  EXPECT_TRUE(CheckListenPolicy("127.0.0.1:1", false, false, false).ok());
  const absl::Status plain = CheckListenPolicy("0.0.0.0:50051", false, false, false);
  EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plain.message(), HasSubstr("--tls_cert"));
  EXPECT_THAT(plain.message(), HasSubstr("--insecure"));
  EXPECT_THAT(CheckListenPolicy("0.0.0.0:50051", true, false, false).message(),
              HasSubstr("without client authentication"));
  EXPECT_TRUE(CheckListenPolicy("0.0.0.0:50051", true, true, false).ok());
  EXPECT_TRUE(CheckListenPolicy("0.0.0.0:50051", false, false, true).ok());
}

TEST(SecurityTest, ServerCredentialsNameTheBadFlag) {
  ServerTlsOptions o;
  o.cert_file = Cert("server.pem");
  EXPECT_THAT(MakeServerCredentials(o).status().message(), HasSubstr("go together"));
  o.key_file = Cert("other.key");
  EXPECT_THAT(MakeServerCredentials(o).status().message(), HasSubstr("--tls_cert/--tls_key"));
  o.key_file = Cert("server.key");
  EXPECT_TRUE(MakeServerCredentials(o).ok());
  o.client_ca_file = Cert("server.key");
  EXPECT_THAT(MakeServerCredentials(o).status().message(), HasSubstr("--tls_client_ca"));
  ServerTlsOptions ca_only;
  ca_only.client_ca_file = Cert("ca.pem");
  EXPECT_FALSE(MakeServerCredentials(ca_only).ok());
}

TEST(SecurityTest, ClientChannelsRefuseTokensInPlaintextBeyondLoopback) {
  testing::ScopedTempDir dir("token");
  std::ofstream(dir.Path("token")) << "s3cret-token\n";
  ClientTlsOptions o;
  o.token_file = dir.Path("token");
  EXPECT_TRUE(CreateClientChannel("127.0.0.1:1", o).ok());
  EXPECT_EQ(CreateClientChannel("10.1.2.3:1", o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  o.insecure = true;
  EXPECT_TRUE(CreateClientChannel("10.1.2.3:1", o).ok());
  o.token_file = dir.Path("absent");
  EXPECT_THAT(CreateClientChannel("127.0.0.1:1", o).status().message(),
              HasSubstr("--tls_token_file"));
  ClientTlsOptions cert_without_ca;
  cert_without_ca.cert_file = Cert("client.pem");
  cert_without_ca.key_file = Cert("client.key");
  EXPECT_THAT(CreateClientChannel("127.0.0.1:1", cert_without_ca).status().message(),
              HasSubstr("--tls_ca"));
}

std::string Principals(const std::string& entries) {
  return absl::StrCat("{\"principals\": [", entries, "]}");
}

TEST(SecurityTest, PrincipalsFileIsParsedAndCheckedEntryByEntry) {
  AuthOptions d;
  d.default_queue_share = 0.5;
  std::vector<std::string> hashes, certs;
  const std::string hash = Sha256Hex("tok");
  auto ok = ParsePrincipals(
      Principals(absl::StrCat(R"({"name": "a", "token_sha256": ")", hash,
                              R"(", "roles": ["submit", "status"], "groups_per_second": 5},)",
                              R"({"name": "b", "certificate": "rollout-1",)",
                              R"( "roles": ["read_weights"], "queue_share": 0.25})")),
      d, &hashes, &certs);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].name, "a");
  EXPECT_TRUE((*ok)[0].Has(Role::kSubmit));
  EXPECT_FALSE((*ok)[0].Has(Role::kReadWeights));
  EXPECT_EQ((*ok)[0].queue_share, 0.5);
  EXPECT_EQ((*ok)[0].groups_per_second, 5);
  EXPECT_EQ((*ok)[1].queue_share, 0.25);
  EXPECT_EQ(hashes[0], hash);
  EXPECT_EQ(certs[1], "rollout-1");
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
    auto s = ParsePrincipals(Principals(entries), d, &hashes, &certs).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << entries;
    EXPECT_THAT(s.message(), HasSubstr(message)) << entries;
  }
  EXPECT_FALSE(ParsePrincipals("[]", d, &hashes, &certs).ok());
  EXPECT_FALSE(ParsePrincipals("{not json", d, &hashes, &certs).ok());
}

TEST(SecurityTest, AuthorizerRefusesAnEmptyPrincipalsFile) {
  testing::ScopedTempDir dir("auth");
  std::ofstream(dir.Path("p.json")) << Principals("");
  AuthOptions o;
  o.principals_file = dir.Path("p.json");
  EXPECT_THAT(Authorizer::Create(o, nullptr).status().message(), HasSubstr("no principals"));
  o.principals_file = dir.Path("absent.json");
  EXPECT_THAT(Authorizer::Create(o, nullptr).status().message(), HasSubstr("cannot be read"));
}

}  // namespace
}  // namespace asympo::security
