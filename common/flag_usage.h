// --help and --version for the programs' main(): the usage text, and only
// the flags that the program's main file defines (not those of gRPC, glog or
// Abseil).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace asympo {

// Sets the --help text and limits --help to the flags defined in files whose
// path ends with `main_file` (e.g. "learner_server/main.cc").
void SetProgramUsage(const std::string& usage, const std::string& main_file);

// Also lists (and checks the ranges of) the flags defined in files whose path
// ends with `flag_file`: flags a library defines once for several programs
// (common/daemon/daemon_main.cc). After SetProgramUsage.
void AddProgramFlagFile(const std::string& flag_file);

// "<program> <version> (ASymPO-RL, <build>)", the program named by argv[0].
std::string VersionString(const char* argv0);

// --help (-h, --helpfull, --helpshort) prints the usage text and this
// program's flags with their defaults (not the test-only ones, whose help
// starts "Testing only") and --version the VersionString, to stdout, and
// both exit 0. Otherwise parses the command line's flags: a value that does
// not parse ("--max_steps=abc") or lies outside its flag's range
// (common/flag_ranges.h) is INVALID_ARGUMENT naming the flag, the value and
// the range, as is a positional argument; an unknown flag exits as Abseil
// does. Then sends glog to stderr.
absl::Status ParseFlagsAndStartLogging(int argc, char** argv);

}  // namespace asympo
