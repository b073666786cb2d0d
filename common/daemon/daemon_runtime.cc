#include "common/daemon/daemon_runtime.h"

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <glog/logging.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/listener/host_port.h"

namespace asympo::daemon {

void RetainFreedMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

namespace {

// RLIMIT_NOFILE as Install found and left it. Install runs before logging
// starts, so the line about it comes later (LogDescriptorLimitOnce).
struct DescriptorLimit {
  rlim_t found = 0;  // the soft limit at start
  rlim_t soft = 0;
  rlim_t hard = 0;
  int error = 0;  // errno of a failed getrlimit or setrlimit
};
DescriptorLimit descriptor_limit;
std::atomic<bool> descriptor_limit_logged{false};

// Raises the soft limit on open descriptors to the hard one: every
// connection a daemon serves takes one (common/listener/grpc_listener.h), and
// distributions still default to a soft limit of 1024.
void RaiseDescriptorLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    descriptor_limit.error = errno;
    return;
  }
  descriptor_limit.found = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
    } else {
      descriptor_limit.error = errno;
    }
  }
  descriptor_limit.soft = limit.rlim_cur;
  descriptor_limit.hard = limit.rlim_max;
}

std::string LimitText(rlim_t limit) {
  return limit == RLIM_INFINITY ? "unlimited" : std::to_string(limit);
}

// Logs the descriptor limit, once, when logging has started.
void LogDescriptorLimitOnce() {
  if (descriptor_limit_logged.exchange(true)) return;
  const DescriptorLimit& d = descriptor_limit;
  if (d.soft == 0) {
    LOG(WARNING) << "cannot read or raise RLIMIT_NOFILE: " << std::strerror(d.error);
    return;
  }
  std::string how = " (the hard limit)";
  if (d.soft < d.hard) {
    how = absl::StrCat(" (hard limit ", LimitText(d.hard),
                       "; raising to it failed: ", std::strerror(d.error), ")");
  } else if (d.found < d.soft) {
    how = absl::StrCat(" (soft limit raised from ", LimitText(d.found), " to the hard limit)");
  }
  LOG(INFO) << "open file descriptors: at most " << LimitText(d.soft) << how;
}

}  // namespace

// What a stop signal does: shut the daemon down once it runs, end the
// process while it starts.
struct DaemonRuntime::Stop {
  absl::Mutex mu;
  std::function<void()> shutdown ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<DaemonRuntime>> DaemonRuntime::Install() {
  RaiseDescriptorLimit();
  // A write to a socket whose peer has gone is an error (EPIPE) for the
  // code that made it, not a signal that ends the daemon: Gloo's transport
  // writes without MSG_NOSIGNAL, and a data-parallel rank that dies while
  // rank 0 sends it a step must be reported, not take rank 0 with it.
  ::signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<std::unique_ptr<StopSignals>> signals = StopSignals::Install();
  if (!signals.ok()) return signals.status();
  std::unique_ptr<DaemonRuntime> runtime(new DaemonRuntime());
  runtime->readiness_ = std::make_shared<Readiness>();
  runtime->signals_ = *std::move(signals);
  runtime->stop_ = std::make_shared<Stop>();
  runtime->signals_->OnStop([stop = runtime->stop_] {
    absl::MutexLock lock(&stop->mu);
    if (stop->shutdown) {
      stop->shutdown();
      return;
    }
    std::fprintf(stderr, "%s: stopped by a signal during start-up\n",
                 program_invocation_short_name);
    std::fflush(stderr);
    std::_Exit(1);
  });
  return runtime;
}

void DaemonRuntime::SetShutdown(std::function<void()> shutdown) {
  LogDescriptorLimitOnce();
  {
    absl::MutexLock lock(&stop_->mu);
    stop_->shutdown = std::move(shutdown);
  }
  // Scripts and supervisors wait for this line: from here on a stop signal
  // is a clean stop (exit 0), before it a stop during start-up (exit 1).
  LOG(INFO) << "ready: SIGINT or SIGTERM now stops it cleanly";
}

absl::Status CheckMetricsAddress(const std::string& address, bool insecure) {
  if (address.empty()) return absl::OkStatus();
  // A malformed address is named as such, not refused as beyond loopback.
  if (absl::Status s = CheckAddressFlag("metrics_address", address); !s.ok()) return s;
  if (insecure || IsLoopbackAddress(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve /metrics on ", address,
      " beyond loopback: it is plain HTTP without authentication; give --metrics_insecure to "
      "serve it there anyway (a firewall or a NetworkPolicy should then limit who reaches it)"));
}

absl::StatusOr<std::string> RunName(const std::string& flag) {
  constexpr size_t kMaxLength = 128;
  if (flag.empty()) {
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) != 0) host = {};
    std::string clean;
    for (const char c : std::string(host.data())) {
      if (absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_') clean.push_back(c);
    }
    if (clean.empty()) clean = "host";
    return absl::StrCat(clean.substr(0, 64), "-",
                        absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()), "-",
                        ::getpid());
  }
  const bool good = flag.size() <= kMaxLength && std::all_of(flag.begin(), flag.end(), [](char c) {
                      return absl::ascii_isalnum(c) || absl::StrContains("._:@/+-", c);
                    });
  if (!good) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run_name: \"", absl::CHexEscape(flag.substr(0, kMaxLength)),
                     "\" must be 1-128 characters of letters, digits and ._:@/+-"));
  }
  return flag;
}

struct DaemonRuntime::Readiness {
  absl::Mutex mu;
  std::function<absl::Status()> ready ABSL_GUARDED_BY(mu);
};

void DaemonRuntime::SetReadiness(std::function<absl::Status()> ready) {
  absl::MutexLock lock(&readiness_->mu);
  readiness_->ready = std::move(ready);
}

absl::Status DaemonRuntime::ServeMetrics(const std::string& address, const std::string& run_name) {
  LogDescriptorLimitOnce();  // the first place after Install where logging has started
  if (address.empty()) return absl::OkStatus();
  MetricsEndpointOptions options;
  if (!run_name.empty()) options.labels = {{"run", run_name}};
  options.ready = [readiness = readiness_] {
    absl::MutexLock lock(&readiness->mu);
    return readiness->ready ? readiness->ready()
                            : absl::UnavailableError("starting (the daemon is being created)");
  };
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(address, registry_, options);
  if (!endpoint.ok()) {
    return absl::Status(endpoint.status().code(),
                        absl::StrCat("--metrics_address: ", endpoint.status().message()));
  }
  endpoint_ = *std::move(endpoint);
  LOG(INFO) << "metrics at http://" << endpoint_->bound_address() << "/metrics"
            << (run_name.empty() ? "" : absl::StrCat(", run=\"", run_name, "\""));
  return absl::OkStatus();
}

}  // namespace asympo::daemon
