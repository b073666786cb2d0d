#include "common/security/authorizer.h"

#include <utility>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace asympo::security {
namespace {

constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMaxCertificateNames = 10000;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        std::string("._:@/+-").find(c) == std::string::npos) {
      return false;
    }
  }
  return true;
}

bool ValidHash(const std::string& h) {
  if (h.size() != 64) return false;
  for (char c : h) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::StatusOr<uint32_t> ParseRoles(const nlohmann::json& roles, const std::string& where) {
  if (!roles.is_array() || roles.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": roles must be a non-empty list"));
  }
  uint32_t out = 0;
  for (const auto& r : roles) {
    const std::string name = r.is_string() ? r.get<std::string>() : r.dump();
    bool known = false;
    for (Role role : {Role::kSubmit, Role::kReadWeights, Role::kStatus}) {
      if (name == RoleName(role)) {
        out |= static_cast<uint32_t>(role);
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown role ", QuoteForMessage(name), " (submit, read_weights, status)"));
    }
  }
  return out;
}

absl::StatusOr<double> Number(const nlohmann::json& e, const char* key, double fallback,
                              const std::string& where) {
  if (!e.contains(key)) return fallback;
  if (!e[key].is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " must be a number"));
  }
  return e[key].get<double>();
}

absl::StatusOr<Principal> ParseEntry(const nlohmann::json& e, size_t index,
                                     const AuthOptions& defaults) {
  std::string where = absl::StrCat("principal ", index);
  if (!e.is_object()) return absl::InvalidArgumentError(where + ": not an object");
  for (const auto& [key, value] : e.items()) {
    static const absl::flat_hash_set<std::string> kKeys = {
        "name", "token_sha256", "certificate", "roles", "queue_share", "groups_per_second"};
    if (!kKeys.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown key ", QuoteForMessage(key)));
    }
  }
  Principal p;
  p.name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "";
  if (!ValidName(p.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": name must be 1-64 characters of [A-Za-z0-9._:@/+-] (it is a metric label)"));
  }
  where = absl::StrCat("principal ", QuoteForMessage(p.name));
  ASYMPO_ASSIGN_OR_RETURN(p.roles, ParseRoles(e.value("roles", nlohmann::json()), where));
  ASYMPO_ASSIGN_OR_RETURN(p.queue_share,
                          Number(e, "queue_share", defaults.default_queue_share, where));
  ASYMPO_ASSIGN_OR_RETURN(p.groups_per_second, Number(e, "groups_per_second",
                                                      defaults.default_groups_per_second, where));
  if (!(p.queue_share > 0 && p.queue_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": queue_share must be in (0, 1]"));
  }
  if (!(p.groups_per_second >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": groups_per_second must be >= 0"));
  }
  return p;
}

// A field that must be a string when present.
absl::StatusOr<std::string> OptionalString(const nlohmann::json& e, const char* key) {
  if (!e.contains(key)) return std::string();
  if (!e[key].is_string() || e[key].get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(key, " of principal ",
                                                   QuoteForMessage(e.value("name", std::string())),
                                                   " must be a non-empty string"));
  }
  return e[key].get<std::string>();
}

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

const char* RoleName(Role role) {
  switch (role) {
    case Role::kSubmit:
      return "submit";
    case Role::kReadWeights:
      return "read_weights";
    case Role::kStatus:
      return "status";
  }
  return "?";
}

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

absl::StatusOr<std::vector<Principal>> ParsePrincipals(const std::string& json,
                                                       const AuthOptions& defaults,
                                                       std::vector<std::string>* token_hashes,
                                                       std::vector<std::string>* certificates) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("principals") ||
      !doc["principals"].is_array()) {
    return absl::InvalidArgumentError(
        "the principals file must be a JSON object with a \"principals\" list");
  }
  std::vector<Principal> out;
  absl::flat_hash_set<std::string> names, hashes, certs;
  for (size_t i = 0; i < doc["principals"].size(); ++i) {
    const nlohmann::json& e = doc["principals"][i];
    ASYMPO_ASSIGN_OR_RETURN(Principal p, ParseEntry(e, i, defaults));
    ASYMPO_ASSIGN_OR_RETURN(std::string hash, OptionalString(e, "token_sha256"));
    ASYMPO_ASSIGN_OR_RETURN(std::string cert, OptionalString(e, "certificate"));
    const std::string who = absl::StrCat("principal ", QuoteForMessage(p.name));
    hash = absl::AsciiStrToLower(hash);
    if (!hash.empty() && !ValidHash(hash)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": token_sha256 must be 64 hex digits (printf %s \"$TOKEN\" | sha256sum)"));
    }
    if (hash.empty() && cert.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": give token_sha256, certificate or both"));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, " is named twice"));
    }
    if (!hash.empty() && !hashes.insert(hash).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": its token hash is another's too"));
    }
    if (!cert.empty() && !certs.insert(cert).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": its certificate is another's too"));
    }
    token_hashes->push_back(hash);
    certificates->push_back(cert);
    out.push_back(std::move(p));
  }
  return out;
}

Authorizer::Authorizer(AuthOptions options, prometheus::Registry* registry)
    : options_(std::move(options)) {
  anonymous_.name = "anonymous";
  anonymous_.roles = ~0u;
  anonymous_.queue_share = options_.default_queue_share;
  anonymous_.groups_per_second = options_.default_groups_per_second;
  if (registry != nullptr) {
    refusals_ = &prometheus::BuildCounter()
                     .Name("asympo_learner_refusals_total")
                     .Help(
                         "Calls refused before any work, by gRPC code and cause (bad or missing "
                         "credentials, a missing role, a quota)")
                     .Register(*registry);
  }
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const AuthOptions& options,
                                                               prometheus::Registry* registry) {
  if (!(options.default_queue_share > 0 && options.default_queue_share <= 1)) {
    return absl::InvalidArgumentError("the default queue share must be in (0, 1]");
  }
  if (!(options.default_groups_per_second >= 0)) {
    return absl::InvalidArgumentError("the default rate must be >= 0 groups per second");
  }
  std::unique_ptr<Authorizer> a(new Authorizer(options, registry));
  if (!options.principals_file.empty()) {
    ASYMPO_ASSIGN_OR_RETURN(std::string text,
                            ReadSecretFile(options.principals_file, "principals file"));
    std::vector<std::string> hashes, certs;
    auto parsed = ParsePrincipals(text, options, &hashes, &certs);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.principals_file, ": ", parsed.status().message()));
    }
    for (size_t i = 0; i < parsed->size(); ++i) {
      a->principals_.push_back(std::make_unique<Principal>((*parsed)[i]));
      if (!hashes[i].empty()) a->by_token_hash_[hashes[i]] = a->principals_.back().get();
      if (!certs[i].empty()) a->by_certificate_[certs[i]] = a->principals_.back().get();
    }
    if (a->principals_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.principals_file, ": no principals: nobody could call"));
    }
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
  if (refusals_ != nullptr) refusals_->Add({{"code", code}, {"cause", cause}}).Increment();
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
  if (!principals_.empty()) {
    for (const std::string& n : names) {
      auto it = by_certificate_.find(n);
      if (it != by_certificate_.end()) return it->second;
    }
    return Refuse(absl::UnauthenticatedError(absl::StrCat(
                      "the client certificate (", QuoteForMessage(names.empty() ? "" : names[0]),
                      ") names no principal of the learner")),
                  "unknown_certificate");
  }
  if (names.empty() || !ValidName(names[0])) {
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
  if (!token.empty() && !by_token_hash_.empty()) {
    auto it = by_token_hash_.find(Sha256Hex(token));
    if (it == by_token_hash_.end()) {
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
