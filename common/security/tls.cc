#include "common/security/tls.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/security/credential_publisher.h"
#include "common/security/x509.h"
#include "common/status_macros.h"

namespace asympo::security {
namespace {

// Adds "authorization: Bearer <token>" to every call of the channel.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token) : header_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

absl::Status CheckPair(const std::string& cert, const std::string& key, const char* cert_flag,
                       const char* key_flag) {
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", cert_flag, " and --", key_flag, " go together: give both or neither"));
  }
  if (cert.empty()) return absl::OkStatus();
  absl::Status s = CheckKeyPair(cert, key);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", cert_flag, "/--", key_flag, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadToken(const std::string& file) {
  auto text = ReadSecretFile(file, "--tls_token_file");
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_token_file ", file, ": the first line is empty"));
  }
  for (char c : token) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_token_file ", file, ": a token is printable ASCII without spaces"));
    }
  }
  return token;
}

// gRPC reads the publisher's private copies: a second is plenty for files
// that change only when the publisher swaps them, and adds no delay of its
// own to a renewal.
constexpr unsigned kProviderRefreshSeconds = 1;

absl::StatusOr<std::unique_ptr<CredentialPublisher>> StartPublisher(
    CredentialPaths files, unsigned reload_seconds, prometheus::Registry& registry) {
  CredentialPublisherOptions o;
  o.files = std::move(files);
  o.interval = absl::Seconds(std::max(1u, reload_seconds));
  return CredentialPublisher::Start(std::move(o), registry);
}

// `object`, owning `publisher` too: the publisher goes when the last copy
// of the pointer does, after the object.
template <typename T>
std::shared_ptr<T> KeepAlive(std::shared_ptr<T> object,
                             std::unique_ptr<CredentialPublisher> publisher) {
  struct Holder {
    std::unique_ptr<CredentialPublisher> publisher;
    std::shared_ptr<T> object;
  };
  auto holder = std::make_shared<Holder>(Holder{std::move(publisher), std::move(object)});
  return std::shared_ptr<T>(holder, holder->object.get());
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& o, prometheus::Registry& registry) {
  ASYMPO_RETURN_IF_ERROR(CheckPair(o.cert_file, o.key_file, "tls_cert", "tls_key"));
  if (o.cert_file.empty()) {
    if (!o.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key: client certificates travel in TLS");
    }
    return grpc::InsecureServerCredentials();
  }
  if (!o.client_ca_file.empty()) {
    if (absl::Status s = CheckCaFile(o.client_ca_file); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_client_ca: ", s.message()));
    }
  }
  ASYMPO_ASSIGN_OR_RETURN(
      auto publisher, StartPublisher({o.cert_file, o.key_file, ""}, o.reload_seconds, registry));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      publisher->key_path(), publisher->cert_path(), kProviderRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  // A client certificate is asked for, and verified per call by the
  // learner's Authorizer against --tls_client_ca: a refused certificate
  // then gets UNAUTHENTICATED naming the fault (expired, untrusted), and
  // is counted, where a failed handshake would tell the client nothing.
  options.set_cert_request_type(o.client_ca_file.empty()
                                    ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                    : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  return KeepAlive(grpc::experimental::TlsServerCredentials(options), std::move(publisher));
}

absl::Status CheckListenPolicy(absl::string_view address, bool tls, bool authenticates,
                               bool insecure) {
  if (insecure || IsLoopbackAddress(address)) return absl::OkStatus();
  if (!tls) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", address,
        " in plaintext: beyond loopback give --tls_cert and --tls_key (docs/security.md), or "
        "--insecure to accept that anyone who can reach the port reads the weights and submits"));
  }
  if (!authenticates) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", address,
        " without client authentication: give --auth_file (bearer tokens) or --tls_client_ca "
        "(mTLS), or --insecure to let any client in"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(const std::string& target,
                                                                   const ClientTlsOptions& o,
                                                                   prometheus::Registry& registry,
                                                                   grpc::ChannelArguments args) {
  ASYMPO_RETURN_IF_ERROR(CheckPair(o.cert_file, o.key_file, "tls_cert", "tls_key"));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  std::unique_ptr<CredentialPublisher> publisher;  // with TLS
  if (o.ca_file.empty()) {
    if (!o.cert_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert needs --tls_ca: a client certificate is only sent over TLS");
    }
    if (!o.token_file.empty() && !o.insecure && !IsLoopbackAddress(target)) {
      return absl::FailedPreconditionError(
          absl::StrCat("refusing to send a bearer token in plaintext to ", target,
                       ": give --tls_ca, or --insecure"));
    }
  } else {
    if (absl::Status s = CheckCaFile(o.ca_file); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_ca: ", s.message()));
    }
    ASYMPO_ASSIGN_OR_RETURN(publisher, StartPublisher({o.cert_file, o.key_file, o.ca_file},
                                                      o.reload_seconds, registry));
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        publisher->key_path(), publisher->cert_path(), publisher->ca_path(),
        kProviderRefreshSeconds);
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(provider);
    options.watch_root_certs();
    if (!o.cert_file.empty()) options.watch_identity_key_cert_pairs();
    creds = grpc::experimental::TlsCredentials(options);
    if (!o.server_name.empty()) args.SetSslTargetNameOverride(o.server_name);
  }
  std::shared_ptr<grpc::Channel> channel;
  if (o.token_file.empty()) {
    channel = grpc::CreateCustomChannel(target, creds, args);
  } else {
    ASYMPO_ASSIGN_OR_RETURN(std::string token, ReadToken(o.token_file));
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
    factories.push_back(std::make_unique<BearerInterceptorFactory>(std::move(token)));
    channel = grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args,
                                                                      std::move(factories));
  }
  if (publisher == nullptr) return channel;
  return KeepAlive(std::move(channel), std::move(publisher));
}

}  // namespace asympo::security
