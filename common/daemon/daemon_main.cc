#include "common/daemon/daemon_main.h"

#include <iostream>
#include <utility>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "common/flag_ranges.h"
#include "common/flag_usage.h"

// The flags both daemons define alike (names, defaults, ranges and help as
// each main file had them).
ABSL_FLAG(bool, metrics_insecure, false,
          "Allow --metrics_address beyond loopback (plain HTTP without authentication).");
ABSL_FLAG(std::string, run_name, "",
          "The run's name: the `run` label on every metric series, which tells runs apart (a "
          "restart on the same port included). Give the learner and its rollouts the same one; "
          "empty: made from the host and the start time.");
ABSL_FLAG(int32_t, threads, 1,
          "CPU threads for tensor work: LibTorch's intra-op threads and OpenBLAS's pool (1 suits "
          "small models on few cores).");
ABSL_FLAG(int64_t, tiny_vocab_size, 64, "Vocabulary of the built-in tiny model.");

ASYMPO_FLAG_RANGE(threads, 1, 1024);
ASYMPO_FLAG_RANGE(tiny_vocab_size, 2, 1 << 20);

namespace asympo::daemon {

DaemonMain::DaemonMain(std::string program, std::string usage, std::string main_file)
    : program_(std::move(program)), usage_(std::move(usage)), main_file_(std::move(main_file)) {}

absl::Status DaemonMain::Start(int argc, char** argv) {
  RetainFreedMemory();
  // Before any thread starts, so that every thread inherits the handlers.
  absl::StatusOr<std::unique_ptr<DaemonRuntime>> runtime = DaemonRuntime::Install();
  if (!runtime.ok()) return runtime.status();
  runtime_ = *std::move(runtime);
  SetProgramUsage(usage_, main_file_);
  AddProgramFlagFile("common/daemon/daemon_main.cc");
  for (const std::string& file : flag_files_) AddProgramFlagFile(file);
  if (absl::Status s = ParseFlagsAndStartLogging(argc, argv); !s.ok()) return s;
  LOG(INFO) << "starting " << VersionString(argv[0]);
  return absl::OkStatus();
}

absl::Status DaemonMain::ServeMetrics(const std::string& metrics_address, bool serve) {
  const absl::StatusOr<std::string> run_name = RunName(absl::GetFlag(FLAGS_run_name));
  if (!run_name.ok()) return run_name.status();
  if (absl::Status s = CheckMetricsAddress(metrics_address, absl::GetFlag(FLAGS_metrics_insecure));
      !s.ok()) {
    return s;
  }
  return serve ? runtime_->ServeMetrics(metrics_address, *run_name) : absl::OkStatus();
}

int DaemonMain::Fail(const absl::Status& status) const {
  std::cerr << program_ << ": " << status.message() << "\n";
  return 2;
}

}  // namespace asympo::daemon
