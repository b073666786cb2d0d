#include "common/security/authorizer.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace asympo::security {
namespace {

constexpr size_t kMaxCertificateNames = 10000;

// The token of an "authorization" header value (null: no header); "" when
// there is none, "\0" when the header is not "Bearer <token>".
std::string BearerToken(const absl::string_view* header) {
  if (header == nullptr) return "";
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(*header, kBearer)) return std::string(1, '\0');  // present, malformed
  return std::string(header->substr(kBearer.size()));
}

std::string BearerToken(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return "";
  const absl::string_view value(it->second.data(), it->second.size());
  return BearerToken(&value);
}

std::string FirstProperty(const grpc::AuthContext& auth, const char* name) {
  const std::vector<grpc::string_ref> values = auth.FindPropertyValues(name);
  return values.empty() ? "" : std::string(values.front().data(), values.front().size());
}

}  // namespace

absl::StatusOr<const Principal*> AuthorizeCall(Authorizer* authorizer,
                                               const grpc::ServerContextBase& ctx, Role role) {
  static const Principal* const kAnonymous = [] {
    auto* p = new Principal;
    p->name = "anonymous";
    p->roles = ~0u;
    return p;
  }();
  if (authorizer == nullptr) return kAnonymous;
  return authorizer->Authorize(ctx, role);
}

std::string PeerAddress(absl::string_view peer) {
  absl::string_view rest = peer;
  if (!absl::ConsumePrefix(&rest, "ipv4:") && !absl::ConsumePrefix(&rest, "ipv6:")) {
    return std::string(peer);
  }
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return std::string(rest);
  absl::string_view host = rest.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return std::string(host);
}

std::string ShareKey(const Authorizer* authorizer, const Principal& principal,
                     const grpc::ServerContextBase& ctx) {
  if (authorizer != nullptr && authorizer->authenticates()) return principal.name;
  return absl::StrCat("peer ", PeerAddress(ctx.peer()));
}

Authorizer::Authorizer(AuthOptions options, prometheus::Family<prometheus::Counter>& refusals)
    : options_(std::move(options)), refusals_(refusals) {
  anonymous_.name = "anonymous";
  anonymous_.roles = ~0u;
  anonymous_.queue_share = options_.default_queue_share;
  anonymous_.groups_per_second = options_.default_groups_per_second;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(
    const AuthOptions& options, prometheus::Family<prometheus::Counter>& refusals,
    prometheus::Registry& registry) {
  if (!(options.default_queue_share > 0 && options.default_queue_share <= 1)) {
    return absl::InvalidArgumentError("the default queue share must be in (0, 1]");
  }
  if (!(options.default_groups_per_second >= 0)) {
    return absl::InvalidArgumentError("the default rate must be >= 0 groups per second");
  }
  std::unique_ptr<Authorizer> a(new Authorizer(options, refusals));
  if (!options.principals_file.empty()) {
    ASYMPO_ASSIGN_OR_RETURN(a->table_, ReadPrincipalsFile(options.principals_file,
                                                          {options.default_queue_share,
                                                           options.default_groups_per_second}));
  }
  if (!options.client_ca_file.empty()) {
    absl::MutexLock lock(&a->mu_);
    a->ca_file_ = std::make_unique<CredentialFiles>(CredentialPaths{"", "", options.client_ca_file},
                                                    registry);
    ASYMPO_RETURN_IF_ERROR(a->ca_file_->Load());
    ASYMPO_ASSIGN_OR_RETURN(
        a->ca_, CertificateAuthority::FromText(a->ca_file_->current().ca, options.client_ca_file));
    a->ca_checked_ = absl::Now();
  }
  return a;
}

void Authorizer::CountRefusal(const std::string& code, const std::string& cause) {
  refusals_.Add({{"code", code}, {"cause", cause}}).Increment();
}

absl::Status Authorizer::Refuse(absl::Status status, const std::string& cause) {
  CountRefusal(absl::StatusCodeToString(status.code()), cause);
  return status;
}

absl::StatusOr<CertificateIdentity> Authorizer::VerifyCertificate(const std::string& leaf,
                                                                  const std::string& chain) {
  const std::string key = Sha256Hex(leaf);
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (now - ca_checked_ >= options_.ca_reload_interval) {  // a renewed CA bundle
    ca_checked_ = now;
    if (ca_file_->Reread(now) == CredentialFiles::Reload::kTaken) {
      auto fresh = CertificateAuthority::FromText(ca_file_->current().ca, options_.client_ca_file);
      if (fresh.ok()) {  // it passed the same checks
        ca_ = *std::move(fresh);
        verified_.clear();
      }
    }
  }
  auto it = verified_.find(key);
  if (it != verified_.end() && now - it->second.at < absl::Minutes(1)) return it->second.identity;
  if (verified_.size() >= kMaxCertificateNames) verified_.clear();
  Verified v{ca_->Verify(leaf, chain, now), now};
  verified_[key] = v;
  return v.identity;
}

absl::StatusOr<const Principal*> Authorizer::FromCertificate(const grpc::AuthContext& auth) {
  const std::string leaf = FirstProperty(auth, GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (leaf.empty()) {
    return Refuse(absl::UnauthenticatedError(
                      "no credentials: send a client certificate the learner's CA issued, or a "
                      "bearer token"),
                  "missing_credentials");
  }
  auto identity = VerifyCertificate(leaf, FirstProperty(auth, "x509_pem_cert_chain"));
  if (!identity.ok()) return Refuse(identity.status(), "bad_certificate");
  std::vector<std::string> names = identity->alt_names;
  if (!identity->common_name.empty()) names.insert(names.begin(), identity->common_name);
  if (!table_.principals.empty()) {
    for (const std::string& n : names) {
      auto it = table_.by_certificate.find(n);
      if (it != table_.by_certificate.end()) return it->second;
    }
    return Refuse(absl::UnauthenticatedError(absl::StrCat(
                      "the client certificate (", QuoteForMessage(names.empty() ? "" : names[0]),
                      ") names no principal of the learner")),
                  "unknown_certificate");
  }
  if (names.empty() || !ValidPrincipalName(names[0])) {
    return Refuse(absl::UnauthenticatedError(
                      "the client certificate has no common name usable as a principal name"),
                  "bad_certificate");
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Principal>& p = by_name_[names[0]];
  if (p == nullptr) {
    if (by_name_.size() > kMaxCertificateNames) by_name_.clear();
    p = std::make_unique<Principal>(anonymous_);
    p->name = names[0];
  }
  return p.get();
}

absl::StatusOr<const Principal*> Authorizer::Authenticate(const absl::string_view* authorization,
                                                          const grpc::AuthContext* auth) {
  return Identify(BearerToken(authorization), auth);
}

absl::StatusOr<const Principal*> Authorizer::Identify(const grpc::ServerContextBase& ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth =
      wants_client_certificates() ? ctx.auth_context() : nullptr;
  return Identify(BearerToken(ctx), auth.get());
}

absl::StatusOr<const Principal*> Authorizer::Identify(const std::string& token,
                                                      const grpc::AuthContext* auth) {
  if (!token.empty() && !table_.by_token_hash.empty()) {
    auto it = table_.by_token_hash.find(Sha256Hex(token));
    if (it == table_.by_token_hash.end()) {
      return Refuse(absl::UnauthenticatedError("the bearer token is not one the learner knows"),
                    "bad_token");
    }
    return it->second;
  }
  if (wants_client_certificates() && auth != nullptr) return FromCertificate(*auth);
  if (!authenticates()) return &anonymous_;
  return Refuse(absl::UnauthenticatedError(
                    "no credentials: send the header \"authorization: Bearer <token>\"" +
                    std::string(wants_client_certificates() ? " or a client certificate" : "")),
                "missing_credentials");
}

absl::StatusOr<const Principal*> Authorizer::Authorize(const grpc::ServerContextBase& ctx,
                                                       Role role) {
  ASYMPO_ASSIGN_OR_RETURN(const Principal* p, Identify(ctx));
  if (!p->Has(role)) {
    std::vector<std::string> has;
    for (Role r : {Role::kSubmit, Role::kReadWeights, Role::kStatus}) {
      if (p->Has(r)) has.push_back(RoleName(r));
    }
    return Refuse(absl::PermissionDeniedError(
                      absl::StrCat("principal ", QuoteForMessage(p->name), " lacks the role ",
                                   RoleName(role), " (it has: ", absl::StrJoin(has, ", "), ")")),
                  "role");
  }
  if (on_authorized_) on_authorized_(ctx.peer());
  return p;
}

void Authorizer::SetOnAuthorized(std::function<void(const std::string& peer)> on_authorized) {
  on_authorized_ = std::move(on_authorized);
}

}  // namespace asympo::security
