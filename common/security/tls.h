// Transport security of the daemons' gRPC servers and channels: TLS with
// certificates reloaded from their files, mTLS, bearer tokens, and the rule
// that nothing listens beyond loopback in plaintext unless the operator
// says so (--insecure). docs/security.md is the operator's guide.
//
// Thread-safe. With TLS, the credentials and channels made here own a
// CredentialPublisher: gRPC reads only files that passed the checks.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/listener/host_port.h"

namespace asympo::security {

struct ServerTlsOptions {
  // PEM certificate chain and private key of the server; both or neither
  // (neither: plaintext).
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle of client certificates (mTLS): clients are asked for a
  // certificate, which the learner's Authorizer verifies against it.
  std::string client_ca_file;
  // How often the certificate and key files are read again (a renewed
  // certificate is served from the next handshake on). A renewed pair
  // passes the start-up checks first, or is refused, logged and counted
  // while the pair in force stays (CredentialPublisher).
  unsigned reload_seconds = 10;
};

// Server credentials: TLS when a certificate is given, else plaintext.
// INVALID_ARGUMENT naming the flag and file when a file is missing, does
// not parse, the key is not the certificate's or the certificate has
// expired. The credentials own the thread that watches the files: keep
// them (or a server built with them) for as long as the server runs.
// Reloads are counted in `registry` (the asympo_tls_* metrics,
// credential_files.h), which must outlive the credentials.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options, prometheus::Registry& registry);

// The listening policy: beyond loopback, a server needs TLS and a way to
// authenticate its callers (a principals file or a client CA), unless
// `insecure`. FAILED_PRECONDITION naming the address and what is missing.
absl::Status CheckListenPolicy(absl::string_view address, bool tls, bool authenticates,
                               bool insecure);

struct ClientTlsOptions {
  // PEM CA bundle the server's certificate must chain to; enables TLS.
  std::string ca_file;
  // The client's own certificate and key, for mTLS (both or neither).
  std::string cert_file;
  std::string key_file;
  // The name the server's certificate must carry, when it is not the
  // target's host (an address reached through a tunnel, say).
  std::string server_name;
  // A file whose first line is the bearer token sent with every call.
  std::string token_file;
  // Allow a token to travel in plaintext to a host beyond loopback.
  bool insecure = false;
  // How often the files are read again; a renewed version passes the
  // start-up checks first, as the server's (ServerTlsOptions).
  unsigned reload_seconds = 10;
};

// A channel to `target` with `options`' security: TLS when a CA file is
// given, the bearer token added to every call. INVALID_ARGUMENT naming the
// flag and file for a bad file; FAILED_PRECONDITION for a token that would
// travel in plaintext beyond loopback without `insecure`. With TLS, reloads
// are counted in `registry` (asympo_tls_*), which must outlive the channel.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& target, const ClientTlsOptions& options, prometheus::Registry& registry,
    grpc::ChannelArguments args = {});

}  // namespace asympo::security
