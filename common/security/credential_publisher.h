// Hands gRPC only TLS files that passed the checks. gRPC 1.51's
// FileWatcherCertificateProvider takes whatever its files hold at the next
// read: an empty certificate aborts the process (its assertion that the
// chain is not empty), a bad one breaks every new handshake. So gRPC is
// pointed at a private directory instead, and this class reads the
// operator's files every `interval` (CredentialFiles), and copies a version
// that passes into it:
//
//   <dir>/gen-<n>/{cert.pem,key.pem,ca.pem}   one generation, written whole
//   <dir>/current -> gen-<n>                   renamed over: an atomic swap
//
// gRPC reads <dir>/current/*.pem, so a certificate and its key are always
// read from one generation: gRPC re-reads the pair when a file's
// modification time (whole seconds) changes during its read, and each
// generation's files carry a later second than the one before. The last two
// generations are kept (a read under way may have resolved the older one).
// The directory is made under /dev/shm when it can be (keys stay in
// memory), else $TMPDIR or /tmp, mode 0700, and removed on destruction.
//
// Thread-safe. One thread of its own, stopped on destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security/credential_files.h"

namespace asympo::security {

struct CredentialPublisherOptions {
  CredentialPaths files;
  // How often the operator's files are read again.
  absl::Duration interval = absl::Seconds(10);
  // Where the private directory is made; empty: /dev/shm, else $TMPDIR or
  // /tmp.
  std::string parent_dir;
};

class CredentialPublisher {
 public:
  // Checks the files as at start (INVALID_ARGUMENT naming the file and the
  // fault), publishes them, and starts watching. Reloads are counted in
  // `registry` (credential_files.h), which must outlive the publisher.
  static absl::StatusOr<std::unique_ptr<CredentialPublisher>> Start(
      CredentialPublisherOptions options, prometheus::Registry& registry);
  ~CredentialPublisher();
  CredentialPublisher(const CredentialPublisher&) = delete;
  CredentialPublisher& operator=(const CredentialPublisher&) = delete;

  // The paths gRPC's provider reads; empty for a file not configured.
  std::string cert_path() const;
  std::string key_path() const;
  std::string ca_path() const;
  const std::string& dir() const { return dir_; }

  // Reads the operator's files now (the thread does so every interval) and
  // publishes them if they changed and pass. What CredentialFiles::Reread
  // says, or kRefused when the new generation could not be written.
  CredentialFiles::Reload ReloadNow();
  // The generation in force (1 after Start).
  int64_t generation() const;

 private:
  CredentialPublisher(CredentialPublisherOptions options, std::string dir,
                      prometheus::Registry& registry);
  absl::Status Publish(const CredentialTexts& texts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  const CredentialPublisherOptions options_;
  const std::string dir_;
  mutable absl::Mutex mu_;
  CredentialFiles files_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t mtime_ ABSL_GUARDED_BY(mu_) = 0;  // of the last generation's files
  CredentialTexts published_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace asympo::security
