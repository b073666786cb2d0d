// The operator's TLS files (a certificate chain and its key, a CA bundle),
// read again while a daemon runs and checked as at start before anything of
// them is used: a rotation that goes wrong (an empty file, one cut short,
// a key that is not the certificate's, an expired certificate, a CA file
// that does not parse) is refused, logged once per bad version of the
// files, counted, and the credentials in force stay in force until good
// files appear. CredentialPublisher hands what passes to gRPC; the learner's
// Authorizer uses it for the client CA.
//
// Metrics (in the registry its owner gives; file = the operator's path):
//   asympo_tls_reload_failures_total{file}  versions of the files refused
//   asympo_tls_reload_refused{file}         1 while the file on disk is refused
//   asympo_tls_reloads_total{file}          renewed files taken
//   asympo_tls_certificate_expiry_timestamp_seconds{file}  the certificate
//                                           in force: its notAfter (Unix s)
//
// Not thread-safe: its owner calls it from one thread at a time.
#pragma once

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asympo::security {

struct CredentialPaths {
  // A PEM certificate chain and its PEM key: both or neither.
  std::string cert_file;
  std::string key_file;
  // A PEM CA bundle; may be empty.
  std::string ca_file;
};

// The files' texts (empty for a path not given).
struct CredentialTexts {
  std::string cert;
  std::string key;
  std::string ca;
  bool operator==(const CredentialTexts& o) const {
    return cert == o.cert && key == o.key && ca == o.ca;
  }
};

// The asympo_tls_* families of a registry. Built by every user of the
// registry: the registry returns the families already there.
struct TlsReloadMetrics {
  explicit TlsReloadMetrics(prometheus::Registry& registry);
  prometheus::Family<prometheus::Counter>* failures;
  prometheus::Family<prometheus::Gauge>* refused;
  prometheus::Family<prometheus::Counter>* reloads;
  prometheus::Family<prometheus::Gauge>* expiry;
};

class CredentialFiles {
 public:
  enum class Reload { kUnchanged, kTaken, kRefused };

  // `registry` must outlive the object.
  CredentialFiles(CredentialPaths paths, prometheus::Registry& registry);

  // Reads and checks the files, at start: INVALID_ARGUMENT naming the file
  // and the fault (CheckCertificateText, CheckPrivateKeyText,
  // CheckKeyMatches, CheckCaText at `now`).
  absl::Status Load(absl::Time now = absl::Now());

  // Reads the files again. kTaken: they changed and pass the checks;
  // current() is now theirs. kRefused: they changed and do not; current()
  // is what it was (the first time a version of the files is refused, it
  // is logged and counted). kUnchanged: as current().
  Reload Reread(absl::Time now = absl::Now());

  // The texts in force (after a successful Load).
  const CredentialTexts& current() const { return current_; }
  const CredentialPaths& paths() const { return paths_; }
  // Why the files on disk are refused; OK when they are not.
  const absl::Status& refusal() const { return refusal_; }

 private:
  // The texts, or the read error with `*blame` set to the file.
  absl::StatusOr<CredentialTexts> Read(std::string* blame) const;
  // The checks; `*blame` is set to the file at fault.
  absl::Status Check(const CredentialTexts& t, absl::Time now, std::string* blame) const;
  void Refuse(const absl::Status& why, const std::string& file, const std::string& fingerprint);
  void Take(CredentialTexts texts);
  void ClearRefusal();
  // Sets the expiry gauge of the certificate in force; " (the certificate
  // expires ...)" for the log, or "".
  std::string RecordExpiry();

  const CredentialPaths paths_;
  TlsReloadMetrics metrics_;
  CredentialTexts current_;
  absl::Status refusal_;
  std::string refused_file_;
  std::string refused_fingerprint_;  // of the version refused last
};

}  // namespace asympo::security
