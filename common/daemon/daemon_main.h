// The start-up both daemons' main() share (asympo-learner, asympo-rollout),
// and the flags both define alike, defined once here: --metrics_insecure,
// --run_name, --threads and --tiny_vocab_size (their --help lists them with
// the program's own). main reads as a sequence of steps:
//
//   DaemonMain m("asympo-rollout", kUsage, "rollout_server/main.cc");
//   if (absl::Status s = m.Start(argc, argv); !s.ok()) return m.Fail(s);
//   ... SetCpuThreads(absl::GetFlag(FLAGS_threads)); options from flags ...
//   if (absl::Status s = m.ServeMetrics(absl::GetFlag(FLAGS_metrics_address)); !s.ok())
//     return m.Fail(s);
//   auto daemon = Daemon::Create(options, m.registry());
//   if (!daemon.ok()) return m.Fail(daemon.status());
//   return m.Run(**daemon);
//
// Exit status: 2 for anything that stops the start (a bad flag, a busy
// port, ...), with "<program>: <message>" on stderr; Run's 0, or 2 with the
// daemon's error; 1 for a stop signal during start-up (DaemonRuntime).
// --help and --version exit 0 from Start. Only daemons link this file: its
// flags would clash with a tool's own --threads. Not thread-safe; main's
// thread calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/daemon/daemon_runtime.h"

ABSL_DECLARE_FLAG(bool, metrics_insecure);
ABSL_DECLARE_FLAG(std::string, run_name);
ABSL_DECLARE_FLAG(int32_t, threads);
ABSL_DECLARE_FLAG(int64_t, tiny_vocab_size);

namespace asympo::daemon {

class DaemonMain {
 public:
  // `program` starts every error line; `usage` and `main_file` are as
  // SetProgramUsage takes them (common/flag_usage.h).
  DaemonMain(std::string program, std::string usage, std::string main_file);

  // A further source file of the program's own flags (AddProgramFlagFile:
  // --help lists them, their ranges are checked). Before Start.
  void AddFlagFile(std::string file) { flag_files_.push_back(std::move(file)); }

  // First in main: keeps freed memory for reuse (RetainFreedMemory),
  // installs the stop signals before any thread starts, parses the flags
  // (--help and --version print and exit 0 here), starts logging and logs
  // "starting <program> <version> (ASymPO-RL, <build>)".
  absl::Status Start(int argc, char** argv);

  // Checks --run_name and `metrics_address` (beyond loopback only with
  // --metrics_insecure) and, when `serve`, serves /metrics there with every
  // series labelled with the run. Errors name the flag.
  absl::Status ServeMetrics(const std::string& metrics_address, bool serve = true);

  // What GET /ready on the metrics endpoint answers while the daemon runs
  // (DaemonRuntime::SetReadiness); without it, ready once Run begins. Run
  // answers 503 "stopping" once the daemon's run has ended, so `ready` may
  // capture the daemon.
  void SetReadiness(std::function<absl::Status()> ready) { ready_ = std::move(ready); }

  // The registry the daemon's metrics live in; it outlives the daemon.
  prometheus::Registry& registry() { return runtime_->registry(); }

  // "<program>: <message>" on stderr; returns 2.
  int Fail(const absl::Status& status) const;

  // Runs the daemon (its Run(), returning a StatusOr) until it ends or a
  // signal calls its Shutdown(); logs the ready line between the two
  // (DaemonRuntime::RunUntilStopped). 0, or Fail with its error.
  template <typename Daemon>
  int Run(Daemon& daemon) {
    using Result = decltype(daemon.Run());
    runtime_->SetReadiness(ready_ ? std::move(ready_) : [] { return absl::OkStatus(); });
    const Result result = runtime_->RunUntilStopped<Result>([&daemon] { daemon.Shutdown(); },
                                                            [&daemon] { return daemon.Run(); });
    runtime_->SetReadiness([] { return absl::UnavailableError("stopping"); });
    return result.ok() ? 0 : Fail(result.status());
  }

 private:
  const std::string program_, usage_, main_file_;
  std::vector<std::string> flag_files_;
  std::function<absl::Status()> ready_;
  std::unique_ptr<DaemonRuntime> runtime_;
};

// Parses the values of a list flag (std::vector<std::string>) as integers
// >= `min` into `out`; INVALID_ARGUMENT naming --`flag` and the value.
template <typename T>
absl::Status ParseIntListFlag(const std::vector<std::string>& values, const char* flag,
                              std::vector<T>* out, T min = 1) {
  for (const std::string& v : values) {
    T x{};
    if (!absl::SimpleAtoi(v, &x) || x < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", v, "\" is not an integer >= ", min));
    }
    out->push_back(x);
  }
  return absl::OkStatus();
}

}  // namespace asympo::daemon
