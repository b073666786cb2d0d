// Certificates, keys and hashes, through OpenSSL: what the daemons check at
// start (a key that does not match its certificate, an expired one) and
// what the learner checks of each client certificate (mTLS).
//
// Thread-safe (pure functions; CertificateAuthority is immutable).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace asympo::security {

// The SHA-256 of `data`: 32 raw bytes, and as 64 lowercase hex digits.
std::string Sha256(absl::string_view data);
std::string Sha256Hex(absl::string_view data);

// Reads a whole file; NOT_FOUND / PERMISSION_DENIED naming `what` (a flag
// name, say) and the path.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what);

// Checks a PEM certificate chain file and its PEM private key: both parse,
// the key is the first certificate's, and the certificate is valid now.
// INVALID_ARGUMENT naming the files and the fault.
absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file);

// Checks that a PEM file holds a CA bundle (CheckCaText).
absl::Status CheckCaFile(const std::string& ca_file);

// The checks behind CheckKeyPair and CheckCaFile, on texts already read, as
// at start so at every reload (CredentialFiles). Each is INVALID_ARGUMENT
// naming `name` (a path) and the fault.
//
// A certificate chain: at least one certificate, every PEM block of it
// parses (a file cut short does not pass), the first is valid at `now`.
absl::Status CheckCertificateText(absl::string_view pem, absl::string_view name, absl::Time now);
// An unencrypted PEM private key.
absl::Status CheckPrivateKeyText(absl::string_view pem, absl::string_view name);
// The key is the chain's first certificate's (both parse).
absl::Status CheckKeyMatches(absl::string_view cert_pem, absl::string_view key_pem,
                             absl::string_view cert_name, absl::string_view key_name);
// A CA bundle: at least one certificate, every PEM block parses, and at
// least one certificate is valid at `now`.
absl::Status CheckCaText(absl::string_view pem, absl::string_view name, absl::Time now);
// When the first certificate of a PEM chain stops being valid.
absl::StatusOr<absl::Time> CertificateNotAfter(absl::string_view pem);

// The identity a client certificate carries.
struct CertificateIdentity {
  std::string common_name;
  std::vector<std::string> alt_names;  // DNS, URI, e-mail and IP SANs, as text
};

// A CA bundle that verifies client certificates.
class CertificateAuthority {
 public:
  // Loads `ca_file` (PEM, one or more certificates; CheckCaText).
  static absl::StatusOr<std::unique_ptr<CertificateAuthority>> Load(const std::string& ca_file);
  // The same from the file's text, `name` for messages.
  static absl::StatusOr<std::unique_ptr<CertificateAuthority>> FromText(absl::string_view pem,
                                                                        absl::string_view name);
  ~CertificateAuthority();

  // Verifies the PEM `leaf` (with the PEM `chain` the peer sent, which may
  // hold intermediates) against the bundle at time `now`. OK with the
  // identity, or UNAUTHENTICATED saying why ("expired on <date>", "not
  // issued by a trusted CA", ...).
  absl::StatusOr<CertificateIdentity> Verify(absl::string_view leaf, absl::string_view chain,
                                             absl::Time now) const;

 private:
  struct Store;
  explicit CertificateAuthority(std::unique_ptr<Store> store);
  std::unique_ptr<Store> store_;
};

}  // namespace asympo::security
