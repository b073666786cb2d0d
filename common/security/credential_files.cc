#include "common/security/credential_files.h"

#include <memory>
#include <tuple>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/security/x509.h"
#include "common/status_macros.h"

namespace asympo::security {

TlsReloadMetrics::TlsReloadMetrics(prometheus::Registry& registry)
    : failures(&prometheus::BuildCounter()
                    .Name("asympo_tls_reload_failures_total")
                    .Help("Versions of a TLS file (certificate, key, CA) refused at reload: "
                          "empty, cut short, not parsing, a key that is not the certificate's, "
                          "expired; the credentials in force stay in force")
                    .Register(registry)),
      refused(&prometheus::BuildGauge()
                   .Name("asympo_tls_reload_refused")
                   .Help("1 while the TLS file on disk is refused and the credentials loaded "
                         "before stay in force")
                   .Register(registry)),
      reloads(&prometheus::BuildCounter()
                   .Name("asympo_tls_reloads_total")
                   .Help("Renewed TLS files taken while running")
                   .Register(registry)),
      expiry(&prometheus::BuildGauge()
                  .Name("asympo_tls_certificate_expiry_timestamp_seconds")
                  .Help("When the certificate in force expires (notAfter, Unix seconds)")
                  .Register(registry)) {}

CredentialFiles::CredentialFiles(CredentialPaths paths, prometheus::Registry& registry)
    : paths_(std::move(paths)), metrics_(registry) {}

absl::StatusOr<CredentialTexts> CredentialFiles::Read(std::string* blame) const {
  CredentialTexts t;
  for (auto [path, text, what] : {std::make_tuple(&paths_.cert_file, &t.cert, "certificate"),
                                  std::make_tuple(&paths_.key_file, &t.key, "key"),
                                  std::make_tuple(&paths_.ca_file, &t.ca, "CA file")}) {
    if (path->empty()) continue;
    auto read = ReadSecretFile(*path, what);
    if (!read.ok()) {
      *blame = *path;
      return absl::InvalidArgumentError(read.status().message());
    }
    *text = *std::move(read);
  }
  return t;
}

absl::Status CredentialFiles::Check(const CredentialTexts& t, absl::Time now,
                                    std::string* blame) const {
  if (!paths_.cert_file.empty()) {
    *blame = paths_.cert_file;
    ASYMPO_RETURN_IF_ERROR(CheckCertificateText(t.cert, paths_.cert_file, now));
    *blame = paths_.key_file;
    ASYMPO_RETURN_IF_ERROR(CheckPrivateKeyText(t.key, paths_.key_file));
    // A key that is not the certificate's: the file that changed alone is
    // the one at fault; when both changed, the certificate.
    *blame = t.cert == current_.cert && t.key != current_.key ? paths_.key_file : paths_.cert_file;
    ASYMPO_RETURN_IF_ERROR(CheckKeyMatches(t.cert, t.key, paths_.cert_file, paths_.key_file));
  }
  if (!paths_.ca_file.empty()) {
    *blame = paths_.ca_file;
    ASYMPO_RETURN_IF_ERROR(CheckCaText(t.ca, paths_.ca_file, now));
  }
  blame->clear();
  return absl::OkStatus();
}

absl::Status CredentialFiles::Load(absl::Time now) {
  std::string blame;
  ASYMPO_ASSIGN_OR_RETURN(CredentialTexts texts, Read(&blame));
  ASYMPO_RETURN_IF_ERROR(Check(texts, now, &blame));
  current_ = std::move(texts);
  RecordExpiry();
  return absl::OkStatus();
}

CredentialFiles::Reload CredentialFiles::Reread(absl::Time now) {
  std::string blame;
  absl::StatusOr<CredentialTexts> texts = Read(&blame);
  if (texts.ok() && *texts == current_) {
    if (!refusal_.ok()) {
      LOG(INFO) << "TLS files are back to the credentials in force (" << refused_file_ << ")";
      ClearRefusal();
    }
    return Reload::kUnchanged;
  }
  absl::Status why = texts.ok() ? Check(*texts, now, &blame) : texts.status();
  if (!why.ok()) {
    // A version of the files: its texts, or the read error.
    const std::string fingerprint =
        texts.ok() ? Sha256Hex(absl::StrCat(texts->cert, "\n--\n", texts->key, "\n--\n", texts->ca))
                   : std::string(why.message());
    Refuse(why, blame, fingerprint);
    return Reload::kRefused;
  }
  Take(*std::move(texts));
  return Reload::kTaken;
}

void CredentialFiles::Refuse(const absl::Status& why, const std::string& file,
                             const std::string& fingerprint) {
  if (fingerprint == refused_fingerprint_) return;  // logged and counted already
  if (!refused_file_.empty() && refused_file_ != file) {
    metrics_.refused->Add({{"file", refused_file_}}).Set(0);
  }
  refused_fingerprint_ = fingerprint;
  refused_file_ = file;
  refusal_ = why;
  LOG(ERROR) << "refusing the renewed TLS file " << file << ": " << why.message()
             << "; the credentials loaded before stay in force until good files appear";
  metrics_.failures->Add({{"file", file}}).Increment();
  metrics_.refused->Add({{"file", file}}).Set(1);
}

void CredentialFiles::ClearRefusal() {
  if (!refused_file_.empty()) {
    metrics_.refused->Add({{"file", refused_file_}}).Set(0);
  }
  refusal_ = absl::OkStatus();
  refused_file_.clear();
  refused_fingerprint_.clear();
}

void CredentialFiles::Take(CredentialTexts texts) {
  ClearRefusal();
  std::string taken;
  for (auto [path, before, after] :
       {std::make_tuple(&paths_.cert_file, &current_.cert, &texts.cert),
        std::make_tuple(&paths_.key_file, &current_.key, &texts.key),
        std::make_tuple(&paths_.ca_file, &current_.ca, &texts.ca)}) {
    if (*before == *after) continue;
    absl::StrAppend(&taken, taken.empty() ? "" : ", ", *path);
    metrics_.reloads->Add({{"file", *path}}).Increment();
  }
  current_ = std::move(texts);
  LOG(INFO) << "took the renewed TLS files " << taken << RecordExpiry();
}

std::string CredentialFiles::RecordExpiry() {
  if (paths_.cert_file.empty()) return "";
  auto not_after = CertificateNotAfter(current_.cert);
  if (!not_after.ok()) return "";
  metrics_.expiry->Add({{"file", paths_.cert_file}})
      .Set(static_cast<double>(absl::ToUnixSeconds(*not_after)));
  return absl::StrCat(" (the certificate expires ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", *not_after, absl::UTCTimeZone()),
                      ")");
}

}  // namespace asympo::security
