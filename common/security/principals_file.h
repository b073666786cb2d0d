// The principals file (JSON; --auth_file): who may call the learner, and as
// what, parsed and validated into a typed table (docs/security.md). The
// Authorizer (authorizer.h) authorizes calls against that table.
//
//   {"principals": [
//     {"name": "rollouts", "token_sha256": "<hex>",
//      "roles": ["submit", "read_weights", "status"]},
//     {"name": "team-a", "certificate": "gen.team-a.example",
//      "roles": ["submit", "status"], "queue_share": 0.25,
//      "groups_per_second": 40}]}
// A token is stored only as the SHA-256 of its bytes (`sha256sum`); a
// certificate entry matches a verified client certificate whose common
// name or one of whose subject alternative names equals it.
//
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace asympo::security {

enum class Role : uint32_t {
  kSubmit = 1,       // Learner.Submit, Learner.SubmitStream
  kReadWeights = 2,  // every WeightBroadcast call: the model's weights
  kStatus = 4,       // Learner.GetStatus
};

// "submit", "read_weights", "status".
const char* RoleName(Role role);

struct Principal {
  std::string name;  // also the `source` label of its metrics
  uint32_t roles = 0;
  // The share of the learner's queue its groups may hold (queued or
  // waiting), and its rate in groups per second (0: no limit).
  double queue_share = 1.0;
  double groups_per_second = 0;
  bool Has(Role r) const { return (roles & static_cast<uint32_t>(r)) != 0; }
};

// Whether `name` may name a principal: 1-64 characters of
// [A-Za-z0-9._:@/+-] (it is a metric label).
bool ValidPrincipalName(const std::string& name);

// What a principal that sets no quota gets.
struct PrincipalDefaults {
  double queue_share = 1.0;
  double groups_per_second = 0;
};

// A principals file, parsed: its principals in the file's order (each at a
// fixed address) and the two ways a caller is found among them.
struct PrincipalTable {
  std::vector<std::unique_ptr<Principal>> principals;
  // By the lowercase hex SHA-256 of the bearer token.
  absl::flat_hash_map<std::string, const Principal*> by_token_hash;
  // By the name a client certificate carries.
  absl::flat_hash_map<std::string, const Principal*> by_certificate;
};

// Parses a principals file's text. INVALID_ARGUMENT naming the entry and
// the rule (a name of 1-64 characters of [A-Za-z0-9._:@/+-], unique; a
// 64-hex-digit token hash, unique; a certificate name, unique; known
// roles; queue_share in (0, 1]; groups_per_second >= 0; no unknown keys).
absl::StatusOr<PrincipalTable> ParsePrincipals(const std::string& json,
                                               const PrincipalDefaults& defaults);

// Reads the file at `path` (ReadSecretFile's errors) and parses it: the
// parse errors prefixed with the path, and INVALID_ARGUMENT for a file
// without principals (nobody could call).
absl::StatusOr<PrincipalTable> ReadPrincipalsFile(const std::string& path,
                                                  const PrincipalDefaults& defaults);

}  // namespace asympo::security
