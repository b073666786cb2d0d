#include "common/daemon/stop_signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace asympo::daemon {
namespace {

// The pipe the handler writes to; -1 while no StopSignals is alive.
std::atomic<int> g_write_fd{-1};
int g_read_fd = -1;
struct sigaction g_old_int, g_old_term;

// Written by the destructor to end the watcher without a stop.
constexpr char kQuit = 0;

void OnSignal(int sig) {
  const int fd = g_write_fd.load();
  if (fd < 0) return;
  const int saved = errno;
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(fd, &c, 1);
  errno = saved;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StopSignals>> StopSignals::Install() {
  if (g_write_fd.load() >= 0) {
    return absl::FailedPreconditionError("stop signals are already installed in this process");
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot create the signal pipe: ", std::strerror(errno)));
  }
  g_read_fd = fds[0];
  g_write_fd = fds[1];
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, &g_old_int);
  ::sigaction(SIGTERM, &action, &g_old_term);
  return std::unique_ptr<StopSignals>(new StopSignals());
}

void StopSignals::OnStop(std::function<void()> stop) {
  CHECK(!watcher_.joinable()) << "OnStop called twice";
  watcher_ = std::thread([stop = std::move(stop)] {
    char sig = kQuit;
    ssize_t n;
    while ((n = ::read(g_read_fd, &sig, 1)) < 0 && errno == EINTR) {
    }
    if (n != 1 || sig == kQuit) return;
    LOG(INFO) << "signal " << static_cast<int>(sig) << " (" << strsignal(sig) << "): stopping";
    stop();
  });
}

StopSignals::~StopSignals() {
  // Later signals get the previous handlers (a second Ctrl-C then ends the
  // process the usual way); the pipe stays until the watcher is gone.
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  const int fd = g_write_fd.exchange(-1);
  if (watcher_.joinable()) {
    const char quit = kQuit;
    [[maybe_unused]] ssize_t n = ::write(fd, &quit, 1);
    watcher_.join();
  }
  ::close(fd);
  ::close(g_read_fd);
  g_read_fd = -1;
}

}  // namespace asympo::daemon
