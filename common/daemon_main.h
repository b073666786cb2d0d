// What the daemons' main() functions share: stop signals and flag usage.
//
// SIGINT and SIGTERM may be delivered to any thread (some are started by
// libraries before main), so the handler only writes to a pipe; a detached
// thread reads it and runs the daemon's stop callback.
#pragma once

#include <functional>
#include <string>

namespace asympo {

// Installs the SIGINT/SIGTERM handler. False when the pipe cannot be made.
bool InstallStopSignalHandler();

// Starts a detached thread that calls `stop` once, on the first signal.
void RunOnStopSignal(std::function<void()> stop);

// Sets the --help text and limits --help to the flags defined in files whose
// path ends with `main_file` (e.g. "learner_server/main.cc").
void SetDaemonUsage(const std::string& usage, const std::string& main_file);

}  // namespace asympo
