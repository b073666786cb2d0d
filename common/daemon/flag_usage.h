// --help for the daemons' main(): the usage text, and only the flags that
// main.cc defines (not those of gRPC, glog or Abseil).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace asympo::daemon {

// Sets the --help text and limits --help to the flags defined in files whose
// path ends with `main_file` (e.g. "learner_server/main.cc").
void SetDaemonUsage(const std::string& usage, const std::string& main_file);

// Parses the command line's flags (exits on a bad flag, as Abseil does);
// a positional argument is INVALID_ARGUMENT naming it. Then sends glog to
// stderr.
absl::Status ParseFlagsAndStartLogging(int argc, char** argv);

}  // namespace asympo::daemon
