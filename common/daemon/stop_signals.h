// SIGINT/SIGTERM for the daemons' main(): the first signal calls a stop
// callback on a thread this object owns.
//
// A signal may be delivered to any thread (libraries start threads before
// main), so the handler only writes the signal number to a pipe, and the
// watcher thread reads it and calls the callback. The destructor ends the
// thread and waits for it: a callback that is running finishes first, and
// none runs afterwards, so the callback may capture objects declared
// before the StopSignals (the daemon) by reference. Declare the daemon
// first, then the StopSignals, so that the watcher goes away first.
//
// One instance per process at a time. Install and OnStop are called from
// one thread (main); the destructor restores the previous handlers.
#pragma once

#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"

namespace asympo::daemon {

class StopSignals {
 public:
  // Installs the handlers. FAILED_PRECONDITION when another instance is
  // alive, INTERNAL when the pipe cannot be made.
  static absl::StatusOr<std::unique_ptr<StopSignals>> Install();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Starts the watcher: `stop` is called once, on the first SIGINT or
  // SIGTERM (a signal that came before OnStop counts). Call at most once.
  void OnStop(std::function<void()> stop);

 private:
  StopSignals() = default;

  std::thread watcher_;
};

}  // namespace asympo::daemon
