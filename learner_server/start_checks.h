// What asympo-learner's options can tell before anything binds or starts
// (before /metrics is served, the model is loaded or the ranks meet), so
// that a mistyped flag ends the start at once with a message that names it:
// "--FLAG=VALUE: what is wrong". LearnerDaemon::Create checks again what
// it needs (tests build options without flags). Thread-compatible.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "learner_server/learner_options.h"

namespace asympo::learner {

// The relations between flags (ValidateLearnerDaemonOptions) and the
// model directory (its config.json) on every rank; on rank 0, which alone
// serves and writes, also --listen (host:port, and beyond loopback TLS and
// client authentication or --insecure), the TLS and principals files
// (readable) and the output directories (writable). INVALID_ARGUMENT or
// FAILED_PRECONDITION naming the flag.
absl::Status CheckBeforeStart(const LearnerDaemonOptions& o);

// Creates `dir` if needed and writes and removes a file in it (empty: OK);
// FAILED_PRECONDITION "--FLAG=DIR cannot be written: why".
absl::Status CheckWritableDir(const std::string& dir, absl::string_view flag);

}  // namespace asympo::learner
