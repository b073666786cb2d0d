// --help for the daemons' main(): the usage text, and only the flags that
// main.cc defines (not those of gRPC, glog or Abseil).
#pragma once

#include <string>

namespace asympo::daemon {

// Sets the --help text and limits --help to the flags defined in files whose
// path ends with `main_file` (e.g. "learner_server/main.cc").
void SetDaemonUsage(const std::string& usage, const std::string& main_file);

}  // namespace asympo::daemon
