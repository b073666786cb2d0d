#include "learner_server/start_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/listener/host_port.h"
#include "common/security/tls.h"
#include "common/status_macros.h"

namespace asympo::learner {
namespace {

// A file a flag names can be opened for reading (empty: OK).
absl::Status CheckReadableFile(const std::string& path, absl::string_view flag) {
  if (path.empty()) return absl::OkStatus();
  std::ifstream in(path);
  if (!in || std::filesystem::is_directory(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", path, ": cannot be read (",
        std::filesystem::is_directory(path) ? "a directory" : std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

// --model: "tiny", or a directory with a config.json.
absl::Status CheckModelFlag(const std::string& model) {
  if (model == "tiny") return absl::OkStatus();
  if (!std::filesystem::is_directory(model)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", model, ": not a directory; expected tiny or a Hugging Face model directory"));
  }
  return CheckReadableFile(model + "/config.json", "model");
}

// The gRPC port of rank 0: host:port, and beyond loopback TLS and client
// authentication unless --insecure (security::CheckListenPolicy).
absl::Status CheckListenFlags(const LearnerDaemonOptions& o) {
  ASYMPO_RETURN_IF_ERROR(CheckAddressFlag("listen", o.listen_address));
  const bool authenticates = !o.auth.principals_file.empty() || !o.tls.client_ca_file.empty();
  if (absl::Status s = security::CheckListenPolicy(o.listen_address, !o.tls.cert_file.empty(),
                                                   authenticates, o.insecure);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--listen=", o.listen_address, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckWritableDir(const std::string& dir, absl::string_view flag) {
  if (dir.empty()) return absl::OkStatus();
  const auto fail = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, "=", dir, " cannot be written: ", why));
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail(ec.message());
  if (!std::filesystem::is_directory(dir)) return fail("not a directory");
  const std::string probe = absl::StrCat(dir, "/.asympo-write-test-", ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) return fail(std::strerror(errno));
  const bool written = std::fputc('x', f) != EOF;
  const bool closed = std::fclose(f) == 0;
  std::remove(probe.c_str());
  if (!written || !closed) return fail("a file in it cannot be written");
  return absl::OkStatus();
}

absl::Status CheckBeforeStart(const LearnerDaemonOptions& o) {
  ASYMPO_RETURN_IF_ERROR(ValidateLearnerDaemonOptions(o));
  ASYMPO_RETURN_IF_ERROR(CheckModelFlag(o.model));
  // The other ranks serve nothing: their pods need not hold rank 0's
  // certificates, principals or output folders.
  if (o.data_parallel.rank != 0) return absl::OkStatus();
  ASYMPO_RETURN_IF_ERROR(CheckListenFlags(o));
  ASYMPO_RETURN_IF_ERROR(CheckReadableFile(o.tls.cert_file, "tls_cert"));
  ASYMPO_RETURN_IF_ERROR(CheckReadableFile(o.tls.key_file, "tls_key"));
  ASYMPO_RETURN_IF_ERROR(CheckReadableFile(o.tls.client_ca_file, "tls_client_ca"));
  ASYMPO_RETURN_IF_ERROR(CheckReadableFile(o.auth.principals_file, "auth_file"));
  ASYMPO_RETURN_IF_ERROR(CheckWritableDir(o.checkpoint_dir, "checkpoint_dir"));
  return CheckWritableDir(o.export_dir, "export_dir");
}

}  // namespace asympo::learner
