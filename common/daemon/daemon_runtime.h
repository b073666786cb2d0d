// What a daemon's main() sets up around the daemon itself, in the order it
// must: the stop signals first (before any thread starts), the Prometheus
// registry and its /metrics endpoint, and a run that a signal can stop.
//
//   auto runtime = DaemonRuntime::Install();            // first in main
//   ... parse flags ...
//   runtime->ServeMetrics(flag);                       // optional
//   auto daemon = Daemon::Create(options, runtime->registry());
//   return runtime->RunUntilStopped([&] { daemon->Shutdown(); },
//                                   [&] { return daemon->Run(); });
//
// Declare the runtime before the daemon: it then outlives it, and so do the
// registry and the endpoint the daemon's metrics live in. Not thread-safe;
// main's thread calls it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "common/daemon/metrics_endpoint.h"
#include "common/daemon/stop_signals.h"

namespace asympo::daemon {

// Keeps memory a daemon frees for its next allocations (glibc: mmap only
// above 32 MiB, trim only above 256 MiB). Both daemons free and reallocate
// large buffers at a high rate: a training step's activations, received
// weight chunks. With glibc's defaults that memory goes back to the kernel
// and is faulted in again every time (a third of the weight transfer rate,
// and 1.8x on the tiny model's training step; docs/benchmarks.md). Call it
// first in main, before any thread starts.
void RetainFreedMemory();

// The run's name, the `run` label on every series a daemon serves, so that
// dashboards and alerts tell runs apart, including a restart on the same
// host and port: `flag` when it is 1-128 of [A-Za-z0-9._:@/+-], else
// INVALID_ARGUMENT naming --run_name. An empty flag makes a name from this
// host and the start time, "<host>-<yyyymmdd>T<hhmmss>Z-<pid>": unique, but
// each daemon of a run then has its own, so launchers pass one name to all.
absl::StatusOr<std::string> RunName(const std::string& flag);

// The metrics endpoint is plain HTTP without authentication: an address
// beyond loopback (--metrics_address) needs `insecure` (--metrics_insecure),
// else FAILED_PRECONDITION naming both flags. An empty address is fine.
absl::Status CheckMetricsAddress(const std::string& address, bool insecure);

class DaemonRuntime {
 public:
  // Installs the SIGINT/SIGTERM handlers (StopSignals::Install's errors)
  // and ignores SIGPIPE: a write to a socket whose peer has gone fails with
  // EPIPE instead of ending the process.
  static absl::StatusOr<std::unique_ptr<DaemonRuntime>> Install();

  // Serves the registry on `address` (MetricsEndpoint::Start), every series
  // labelled run=`run_name` when that is not empty; an empty address serves
  // nothing. Errors name the flag.
  absl::Status ServeMetrics(const std::string& address, const std::string& run_name = "");

  // What GET /ready on the metrics endpoint answers from now on (any
  // thread; `ready` must not wait, see MetricsEndpointOptions::ready). Until
  // the first call it is 503 "starting".
  void SetReadiness(std::function<absl::Status()> ready);

  prometheus::Registry& registry() { return *registry_; }
  // 0 without an endpoint.
  int metrics_port() const { return endpoint_ ? endpoint_->port() : 0; }

  // Calls run(); the first SIGINT or SIGTERM meanwhile calls shutdown() on
  // the signal watcher's thread. When this returns the watcher is gone, so
  // `shutdown` may capture the daemon, which may then be destroyed.
  //
  // A signal that comes earlier, while the daemon is still being created
  // (loading a model, restoring a checkpoint, waiting for the other
  // data-parallel ranks), ends the process at once with exit status 1 and
  // "<program>: stopped by a signal during start-up": nothing has been
  // written yet, and a rank waiting for a peer that was stopped with it
  // would otherwise wait out its whole rendezvous timeout. The line "ready:
  // SIGINT or SIGTERM now stops it cleanly" is logged between the two.
  template <typename Result>
  Result RunUntilStopped(std::function<void()> shutdown, const std::function<Result()>& run) {
    SetShutdown(std::move(shutdown));
    Result result = run();
    signals_.reset();
    return result;
  }

 private:
  struct Stop;
  DaemonRuntime() = default;
  void SetShutdown(std::function<void()> shutdown);

  std::shared_ptr<Stop> stop_;
  std::unique_ptr<StopSignals> signals_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  struct Readiness;
  std::shared_ptr<Readiness> readiness_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

}  // namespace asympo::daemon
