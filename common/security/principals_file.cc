#include "common/security/principals_file.h"

#include <utility>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/security/x509.h"
#include "common/status_macros.h"

namespace asympo::security {
namespace {

constexpr size_t kMaxNameBytes = 64;

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
                                     const PrincipalDefaults& defaults) {
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
  if (!ValidPrincipalName(p.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": name must be 1-64 characters of [A-Za-z0-9._:@/+-] (it is a metric label)"));
  }
  where = absl::StrCat("principal ", QuoteForMessage(p.name));
  ASYMPO_ASSIGN_OR_RETURN(p.roles, ParseRoles(e.value("roles", nlohmann::json()), where));
  ASYMPO_ASSIGN_OR_RETURN(p.queue_share, Number(e, "queue_share", defaults.queue_share, where));
  ASYMPO_ASSIGN_OR_RETURN(p.groups_per_second,
                          Number(e, "groups_per_second", defaults.groups_per_second, where));
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

bool ValidPrincipalName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        std::string("._:@/+-").find(c) == std::string::npos) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<PrincipalTable> ParsePrincipals(const std::string& json,
                                               const PrincipalDefaults& defaults) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("principals") ||
      !doc["principals"].is_array()) {
    return absl::InvalidArgumentError(
        "the principals file must be a JSON object with a \"principals\" list");
  }
  PrincipalTable table;
  absl::flat_hash_set<std::string> names;
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
    if (!hash.empty() && table.by_token_hash.contains(hash)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": its token hash is another's too"));
    }
    if (!cert.empty() && table.by_certificate.contains(cert)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": its certificate is another's too"));
    }
    table.principals.push_back(std::make_unique<Principal>(std::move(p)));
    if (!hash.empty()) table.by_token_hash[hash] = table.principals.back().get();
    if (!cert.empty()) table.by_certificate[cert] = table.principals.back().get();
  }
  return table;
}

absl::StatusOr<PrincipalTable> ReadPrincipalsFile(const std::string& path,
                                                  const PrincipalDefaults& defaults) {
  ASYMPO_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(path, "principals file"));
  absl::StatusOr<PrincipalTable> table = ParsePrincipals(text, defaults);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", table.status().message()));
  }
  if (table->principals.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no principals: nobody could call"));
  }
  return table;
}

}  // namespace asympo::security
