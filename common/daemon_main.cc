#include "common/daemon_main.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include <glog/logging.h>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace asympo {
namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

}  // namespace

bool InstallStopSignalHandler() {
  if (::pipe(g_signal_pipe) != 0) return false;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  return true;
}

void RunOnStopSignal(std::function<void()> stop) {
  std::thread([stop = std::move(stop)] {
    char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    LOG(INFO) << "signal " << static_cast<int>(sig) << ": stopping";
    stop();
  }).detach();
}

void SetDaemonUsage(const std::string& usage, const std::string& main_file) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [main_file](absl::string_view path) {
    return absl::EndsWith(path, main_file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace asympo
