// TLS files read again while a daemon runs: a rotation that goes wrong is
// refused, logged and counted while the credentials in force stay; what
// passes is published whole into the directory gRPC reads.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include "common/security/credential_files.h"
#include "common/security/credential_publisher.h"
#include "common/security/tls.h"
#include "common/security/x509.h"
#include "tests/testing/certs.h"
#include "tests/testing/metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace asympo::security {
namespace {

using ::asympo::testing::MetricValue;
using ::asympo::testing::TestCertificates;
using ::testing::HasSubstr;
using Reload = CredentialFiles::Reload;

std::string Text(const std::string& path) {
  auto text = ReadSecretFile(path, "test file");
  return text.ok() ? *text : "";
}

// The operator's side: files replaced by rename, or written in place.
class Files {
 public:
  Files() : dir_("tls_files") {}
  std::string Path(const std::string& name) const { return dir_.Path(name); }
  void Replace(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name + ".tmp"), std::ios::binary) << text;
    std::filesystem::rename(Path(name + ".tmp"), Path(name));
  }
  void Copy(const std::string& test_cert, const std::string& name) const {
    Replace(name, Text(TestCertificates::Path(test_cert)));
  }
  void TruncateInPlace(const std::string& name) const {
    std::filesystem::resize_file(Path(name), std::filesystem::file_size(Path(name)) / 2);
  }

 private:
  testing::ScopedTempDir dir_;
};

TEST(CredentialFilesTest, TheChecksAtStartNameTheFileAndTheFault) {
  const std::string cert = Text(TestCertificates::Path("server.pem"));
  const absl::Time now = absl::Now();  // after the certificates are made (notBefore)
  EXPECT_OK(CheckCertificateText(cert, "c.pem", now));
  EXPECT_THAT(CheckCertificateText("", "c.pem", now).message(), HasSubstr("c.pem is empty"));
  EXPECT_THAT(CheckCertificateText(cert.substr(0, cert.size() / 2), "c.pem", now).message(),
              HasSubstr("certificate 1 of 1 does not parse"));
  EXPECT_THAT(CheckCertificateText(cert + cert.substr(0, 100), "c.pem", now).message(),
              HasSubstr("certificate 2 of 2 does not parse"));
  EXPECT_THAT(CheckCertificateText("garbage", "c.pem", now).message(),
              HasSubstr("holds no PEM certificate"));
  EXPECT_THAT(
      CheckCertificateText(Text(TestCertificates::Path("expired.pem")), "c.pem", now).message(),
      HasSubstr("expired on Jan  2 00:00:00 2020 GMT"));
  EXPECT_THAT(CheckPrivateKeyText("", "k.pem").message(), HasSubstr("k.pem is empty"));
  EXPECT_THAT(
      CheckKeyMatches(cert, Text(TestCertificates::Path("other.key")), "c.pem", "k.pem").message(),
      HasSubstr("key k.pem is not the key of certificate c.pem"));
  const std::string ca = Text(TestCertificates::Path("ca.pem"));
  EXPECT_OK(CheckCaText(ca, "ca.pem", now));
  EXPECT_THAT(CheckCaText(ca.substr(0, ca.size() - 40), "ca.pem", now).message(),
              HasSubstr("does not parse"));
  EXPECT_THAT(CheckCaText(Text(TestCertificates::Path("expired.pem")), "ca.pem", now).message(),
              HasSubstr("no certificate of it is valid now"));
  auto not_after = CertificateNotAfter(Text(TestCertificates::Path("expired.pem")));
  ASSERT_OK(not_after);
  EXPECT_EQ(*not_after,
            absl::FromCivil(absl::CivilSecond(2020, 1, 2, 0, 0, 0), absl::UTCTimeZone()));
}

// Each bad rotation the learner once died of or took: refused, counted once
// per version of the files, the texts in force unchanged; good files are
// then taken.
TEST(CredentialFilesTest, ABadRotationIsRefusedAndCountedAndTheOldPairStays) {
  Files f;
  f.Copy("server.pem", "cert.pem");
  f.Copy("server.key", "key.pem");
  prometheus::Registry registry;
  CredentialFiles files({f.Path("cert.pem"), f.Path("key.pem"), ""}, registry);
  ASSERT_OK(files.Load());
  const CredentialTexts good = files.current();
  EXPECT_EQ(files.Reread(), Reload::kUnchanged);
  struct Case {
    const char* what;
    std::function<void()> breaks;
    const char* file;  // blamed
    const char* words;
  };
  const std::string cert = Text(TestCertificates::Path("server.pem"));
  const std::vector<Case> cases = {
      {"empty certificate", [&] { f.Replace("cert.pem", ""); }, "cert.pem", "is empty"},
      {"empty key", [&] { f.Replace("key.pem", ""); }, "key.pem", "is empty"},
      {"certificate cut short", [&] { f.TruncateInPlace("cert.pem"); }, "cert.pem",
       "does not parse"},
      {"garbage certificate", [&] { f.Replace("cert.pem", "-----BEGIN CERTIFICATE-----\nxx\n"); },
       "cert.pem", "does not parse"},
      {"another key", [&] { f.Copy("other.key", "key.pem"); }, "key.pem", "is not the key of"},
      {"expired pair",
       [&] {
         f.Copy("expired.key", "key.pem");
         f.Copy("expired.pem", "cert.pem");
       },
       "cert.pem", "expired on"},
      {"missing key", [&] { std::filesystem::remove(f.Path("key.pem")); }, "key.pem",
       "cannot be read"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    c.breaks();
    const double before = MetricValue(registry, "asympo_tls_reload_failures_total", f.Path(c.file));
    EXPECT_EQ(files.Reread(), Reload::kRefused);
    EXPECT_EQ(files.Reread(), Reload::kRefused);  // the same version: counted once
    EXPECT_TRUE(files.current() == good);
    EXPECT_THAT(files.refusal().message(), HasSubstr(c.words));
    EXPECT_EQ(MetricValue(registry, "asympo_tls_reload_failures_total", f.Path(c.file)),
              (std::isnan(before) ? 0 : before) + 1);
    EXPECT_EQ(MetricValue(registry, "asympo_tls_reload_refused", f.Path(c.file)), 1);
    f.Copy("server.pem", "cert.pem");  // back to the pair in force
    f.Copy("server.key", "key.pem");
    EXPECT_EQ(files.Reread(), Reload::kUnchanged);
    EXPECT_OK(files.refusal());
    EXPECT_EQ(MetricValue(registry, "asympo_tls_reload_refused", f.Path(c.file)), 0);
  }
  f.Copy("server2.key", "key.pem");
  f.Copy("server2.pem", "cert.pem");
  EXPECT_EQ(files.Reread(), Reload::kTaken);
  EXPECT_EQ(files.current().cert, Text(TestCertificates::Path("server2.pem")));
  EXPECT_EQ(MetricValue(registry, "asympo_tls_reloads_total", f.Path("cert.pem")), 1);
  EXPECT_EQ(
      MetricValue(registry, "asympo_tls_certificate_expiry_timestamp_seconds", f.Path("cert.pem")),
      absl::ToUnixSeconds(*CertificateNotAfter(files.current().cert)));
}

TEST(CredentialFilesTest, ABadCaFileIsRefused) {
  Files f;
  f.Copy("ca.pem", "ca.pem");
  prometheus::Registry registry;
  CredentialFiles files({"", "", f.Path("ca.pem")}, registry);
  ASSERT_OK(files.Load());
  f.TruncateInPlace("ca.pem");
  EXPECT_EQ(files.Reread(), Reload::kRefused);
  EXPECT_EQ(files.current().ca, Text(TestCertificates::Path("ca.pem")));
  EXPECT_EQ(MetricValue(registry, "asympo_tls_reload_failures_total", f.Path("ca.pem")), 1);
  f.Copy("rogue_ca.pem", "ca.pem");
  EXPECT_EQ(files.Reread(), Reload::kTaken);
  EXPECT_EQ(files.current().ca, Text(TestCertificates::Path("rogue_ca.pem")));
}

int64_t Mtime(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : -1;
}

// gRPC reads <dir>/current/*: only checked files, a pair from one
// generation, a later modification time for each generation.
TEST(CredentialPublisherTest, PublishesOnlyCheckedFilesAndSwapsThePairWhole) {
  Files f;
  f.Copy("server.pem", "cert.pem");
  f.Copy("server.key", "key.pem");
  f.Copy("ca.pem", "ca.pem");
  CredentialPublisherOptions o;
  o.files = {f.Path("cert.pem"), f.Path("key.pem"), f.Path("ca.pem")};
  o.interval = absl::Hours(1);  // the test reloads by hand
  prometheus::Registry registry;
  auto publisher = CredentialPublisher::Start(o, registry);
  ASSERT_OK(publisher);
  CredentialPublisher& p = **publisher;
  const std::string dir = p.dir();
  EXPECT_EQ(Text(p.cert_path()), Text(TestCertificates::Path("server.pem")));
  EXPECT_EQ(Text(p.key_path()), Text(TestCertificates::Path("server.key")));
  EXPECT_EQ(Text(p.ca_path()), Text(TestCertificates::Path("ca.pem")));
  EXPECT_EQ(std::filesystem::status(dir).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  const int64_t first_mtime = Mtime(p.cert_path());
  f.Replace("cert.pem", "");
  EXPECT_EQ(p.ReloadNow(), Reload::kRefused);
  EXPECT_EQ(p.generation(), 1);
  EXPECT_EQ(Text(p.cert_path()), Text(TestCertificates::Path("server.pem")));
  for (int round = 0; round < 3; ++round) {  // renewals within one second
    f.Copy(round % 2 == 0 ? "server2.key" : "server.key", "key.pem");
    f.Copy(round % 2 == 0 ? "server2.pem" : "server.pem", "cert.pem");
    EXPECT_EQ(p.ReloadNow(), Reload::kTaken);
    EXPECT_EQ(p.generation(), round + 2);
    EXPECT_EQ(Text(p.cert_path()), Text(f.Path("cert.pem")));
    EXPECT_EQ(Text(p.key_path()), Text(f.Path("key.pem")));
    EXPECT_EQ(Mtime(p.key_path()), Mtime(p.cert_path()));
    EXPECT_EQ(Mtime(p.cert_path()), first_mtime + round + 1);
  }
  int generations = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    generations += e.path().filename().string().rfind("gen-", 0) == 0;
  }
  EXPECT_EQ(generations, 2);  // the one in force and the one before
  publisher->reset();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(CredentialPublisherTest, RefusesBadFilesAtStart) {
  Files f;
  f.Copy("server.pem", "cert.pem");
  f.Copy("other.key", "key.pem");
  CredentialPublisherOptions o;
  o.files = {f.Path("cert.pem"), f.Path("key.pem"), ""};
  prometheus::Registry registry;
  EXPECT_THAT(CredentialPublisher::Start(o, registry).status().message(),
              HasSubstr("is not the key of"));
}

// Why the publisher exists: gRPC 1.51's own provider, watching the
// operator's files, aborts the process once the certificate is emptied and
// a handshake comes (its assertion that the chain is not empty).
TEST(CredentialPublisherDeathTest, GrpcsOwnProviderAbortsOnAnEmptiedCertificate) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Files f;
  f.Copy("server.pem", "cert.pem");
  f.Copy("server.key", "key.pem");
  const auto serve_and_empty_the_certificate = [&] {
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        f.Path("key.pem"), f.Path("cert.pem"), 1);
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_identity_key_cert_pairs();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::experimental::TlsServerCredentials(options),
                             &port);
    grpc::CallbackGenericService no_methods;
    builder.RegisterCallbackGenericService(&no_methods);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    f.Replace("cert.pem", "");
    const absl::Time end = absl::Now() + absl::Seconds(10);
    prometheus::Registry registry;
    while (absl::Now() < end) {  // new handshakes
      ClientTlsOptions c;
      c.ca_file = TestCertificates::Path("ca.pem");
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto channel = CreateClientChannel("127.0.0.1:" + std::to_string(port), c, registry, args);
      (*channel)->WaitForConnected(std::chrono::system_clock::now() +
                                   std::chrono::milliseconds(500));
      absl::SleepFor(absl::Milliseconds(100));
    }
  };
  EXPECT_DEATH(serve_and_empty_the_certificate(), "assertion failed");
}

// The defect itself, in one process: a server whose certificate file is
// emptied keeps running and serving the pair in force (gRPC 1.51 aborted
// on the empty chain), and takes a good renewal.
TEST(CredentialPublisherTest, AServerOutlivesAnEmptiedCertificateAndTakesTheRenewal) {
  Files f;
  f.Copy("server.pem", "cert.pem");
  f.Copy("server.key", "key.pem");
  prometheus::Registry registry;
  ServerTlsOptions tls;
  tls.cert_file = f.Path("cert.pem");
  tls.key_file = f.Path("key.pem");
  tls.reload_seconds = 1;
  auto creds = MakeServerCredentials(tls, registry);
  ASSERT_OK(creds);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *creds, &port);
  grpc::CallbackGenericService no_methods;  // a server needs a service
  builder.RegisterCallbackGenericService(&no_methods);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  // A new handshake, trusting `ca`: whether it completes.
  prometheus::Registry client_registry;
  const auto handshake = [&](const std::string& ca) {
    ClientTlsOptions c;
    c.ca_file = TestCertificates::Path(ca);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel =
        CreateClientChannel("127.0.0.1:" + std::to_string(port), c, client_registry, args);
    return channel.ok() &&
           (*channel)->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(3));
  };
  EXPECT_TRUE(handshake("ca.pem"));
  f.Replace("cert.pem", "");
  EXPECT_TRUE(asympo::testing::WaitFor(
      [&] {
        return MetricValue(registry, "asympo_tls_reload_failures_total", f.Path("cert.pem")) == 1;
      },
      absl::Seconds(10)));
  absl::SleepFor(absl::Seconds(2));  // gRPC's own reads of its copies
  EXPECT_TRUE(handshake("ca.pem"));
  f.Copy("server2.key", "key.pem");
  f.Copy("server2.pem", "cert.pem");
  EXPECT_TRUE(
      asympo::testing::WaitFor([&] { return handshake("rogue_ca.pem"); }, absl::Seconds(15)));
  EXPECT_FALSE(handshake("ca.pem"));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

// A rollout's side: its client key and CA emptied under a running channel.
// The server closes connections every half second, so each check below is
// a new handshake with the pair and CA in force.
TEST(CredentialPublisherTest, AClientChannelOutlivesAnEmptiedKeyAndCa) {
  Files f;
  f.Copy("client.pem", "cert.pem");
  f.Copy("client.key", "key.pem");
  f.Copy("ca.pem", "ca.pem");
  ServerTlsOptions server_tls;
  server_tls.cert_file = TestCertificates::Path("server.pem");
  server_tls.key_file = TestCertificates::Path("server.key");
  server_tls.client_ca_file = TestCertificates::Path("ca.pem");
  prometheus::Registry server_registry;
  auto server_creds = MakeServerCredentials(server_tls, server_registry);
  ASSERT_OK(server_creds);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *server_creds, &port);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 500);
  grpc::CallbackGenericService no_methods;
  builder.RegisterCallbackGenericService(&no_methods);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  prometheus::Registry registry;
  ClientTlsOptions c;
  c.ca_file = f.Path("ca.pem");
  c.cert_file = f.Path("cert.pem");
  c.key_file = f.Path("key.pem");
  c.reload_seconds = 1;
  auto channel = CreateClientChannel("127.0.0.1:" + std::to_string(port), c, registry);
  ASSERT_OK(channel);
  const auto connects = [&] {
    return (*channel)->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(3));
  };
  EXPECT_TRUE(connects());
  f.Replace("key.pem", "");
  f.Replace("ca.pem", "");
  EXPECT_TRUE(asympo::testing::WaitFor(
      [&] {
        return MetricValue(registry, "asympo_tls_reload_failures_total", f.Path("key.pem")) == 1;
      },
      absl::Seconds(10)));
  for (int i = 0; i < 6; ++i) {  // 3 s: several reconnections
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_TRUE(connects()) << i;
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace asympo::security
