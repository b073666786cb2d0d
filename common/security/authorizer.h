// Who may call the learner, and as what: bearer tokens or verified client
// certificates (mTLS) mapped to principals with roles and quotas
// (docs/security.md). The principals and their file are principals_file.h's;
// this authorizes each call against them. Tokens are never logged, nor
// echoed in errors.
//
// Modes, by what is configured:
// - nothing: every caller is the principal "anonymous" with every role (a
//   learner on loopback, or one started with --insecure);
// - a client CA only: every caller must show a certificate the CA issued;
//   its common name (else its first alternative name) is the principal,
//   with every role;
// - a principals file: every caller must match one of its principals.
//
// Thread-safe. Refusals are counted in the counter family its caller gives
// (labels code and cause); the learner registers its own.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/server_context.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security/credential_files.h"
#include "common/security/principals_file.h"
#include "common/security/x509.h"

namespace asympo::security {

struct AuthOptions {
  std::string principals_file;  // empty: no tokens, no principals
  std::string client_ca_file;   // empty: client certificates are not asked for
  // For principals that set none, and for "anonymous".
  double default_queue_share = 1.0;
  double default_groups_per_second = 0;
  // How often the CA file is looked at for changes.
  absl::Duration ca_reload_interval = absl::Seconds(10);
};

class Authorizer;

// `authorizer`->Authorize(ctx, role), or, without an authorizer (null), the
// principal "anonymous" with every role and no quotas.
absl::StatusOr<const Principal*> AuthorizeCall(Authorizer* authorizer,
                                               const grpc::ServerContextBase& ctx, Role role);

// The address of a gRPC peer string without its port: "ipv4:10.0.0.7:40312"
// gives "10.0.0.7", "ipv6:[::1]:40312" gives "::1"; anything else itself.
std::string PeerAddress(absl::string_view peer);

// The key a caller's fair shares (open streams, fetches under way,
// registrations) are counted under: its principal's name where `authorizer`
// authenticates callers, else "peer " and its peer address, since anonymous
// callers all share one principal.
std::string ShareKey(const Authorizer* authorizer, const Principal& principal,
                     const grpc::ServerContextBase& ctx);

class Authorizer {
 public:
  // Reads the principals file and the client CA of `options`. Refusals are
  // counted in `refusals` (labels code and cause), the CA file's reloads in
  // `registry` (credential_files.h); both must outlive the authorizer.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(
      const AuthOptions& options, prometheus::Family<prometheus::Counter>& refusals,
      prometheus::Registry& registry);

  // The caller of `ctx`, if it may act in `role`. UNAUTHENTICATED (no
  // credentials, an unknown token, a certificate that is missing, expired,
  // untrusted or unknown) or PERMISSION_DENIED (a principal without the
  // role), counted.
  absl::StatusOr<const Principal*> Authorize(const grpc::ServerContextBase& ctx, Role role);

  // The same check on what a call carries before any of its message is read
  // (its "authorization" header, null when absent, and its connection's auth
  // context, may be null): the principal, without a role check, or the
  // refusal, counted (security::GateCallsOnMetadata runs it).
  absl::StatusOr<const Principal*> Authenticate(const absl::string_view* authorization,
                                                const grpc::AuthContext* auth);

  // Called with ServerContext::peer() ("ipv4:127.0.0.1:40312") of every call
  // that Authorize lets through, from gRPC's threads: the listener's
  // connection table marks the connection as one that authenticated. Set
  // before the server starts.
  void SetOnAuthorized(std::function<void(const std::string& peer)> on_authorized);

  // Counts a refusal made elsewhere (a quota): code as GrpcCodeName, cause
  // a short snake_case word.
  void CountRefusal(const std::string& code, const std::string& cause);

  // Whether callers must authenticate (a principals file or a client CA).
  bool authenticates() const {
    return !table_.principals.empty() || !options_.client_ca_file.empty();
  }
  // Whether client certificates are asked for.
  bool wants_client_certificates() const { return !options_.client_ca_file.empty(); }
  const AuthOptions& options() const { return options_; }

 private:
  Authorizer(AuthOptions options, prometheus::Family<prometheus::Counter>& refusals);
  absl::StatusOr<const Principal*> Identify(const grpc::ServerContextBase& ctx);
  // `token`: "" without one, "\0" for a malformed header.
  absl::StatusOr<const Principal*> Identify(const std::string& token,
                                            const grpc::AuthContext* auth);
  absl::StatusOr<const Principal*> FromCertificate(const grpc::AuthContext& auth);
  absl::StatusOr<CertificateIdentity> VerifyCertificate(const std::string& leaf,
                                                        const std::string& chain);
  absl::Status Refuse(absl::Status status, const std::string& cause);

  const AuthOptions options_;
  PrincipalTable table_;  // empty without a principals file
  Principal anonymous_;
  prometheus::Family<prometheus::Counter>& refusals_;
  std::function<void(const std::string& peer)> on_authorized_;

  absl::Mutex mu_;
  std::unique_ptr<CertificateAuthority> ca_ ABSL_GUARDED_BY(mu_);
  absl::Time ca_checked_ ABSL_GUARDED_BY(mu_);
  // The client CA file: a renewed one is taken only if it passes the
  // start-up checks; a bad one is logged, counted, and ca_ stays.
  std::unique_ptr<CredentialFiles> ca_file_ ABSL_GUARDED_BY(mu_);
  struct Verified {
    absl::StatusOr<CertificateIdentity> identity;
    absl::Time at;
  };
  absl::flat_hash_map<std::string, Verified> verified_ ABSL_GUARDED_BY(mu_);  // by leaf hash
  // CA-only mode: one principal per certificate name.
  absl::flat_hash_map<std::string, std::unique_ptr<Principal>> by_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::security
