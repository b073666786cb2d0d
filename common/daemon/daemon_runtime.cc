#include "common/daemon/daemon_runtime.h"

#include <malloc.h>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace asympo::daemon {

void RetainFreedMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

absl::StatusOr<std::unique_ptr<DaemonRuntime>> DaemonRuntime::Install() {
  absl::StatusOr<std::unique_ptr<StopSignals>> signals = StopSignals::Install();
  if (!signals.ok()) return signals.status();
  std::unique_ptr<DaemonRuntime> runtime(new DaemonRuntime());
  runtime->signals_ = *std::move(signals);
  return runtime;
}

absl::Status DaemonRuntime::ServeMetrics(const std::string& address) {
  if (address.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(address, registry_);
  if (!endpoint.ok()) {
    return absl::Status(endpoint.status().code(),
                        absl::StrCat("--metrics_address: ", endpoint.status().message()));
  }
  endpoint_ = *std::move(endpoint);
  LOG(INFO) << "metrics at http://" << endpoint_->bound_address() << "/metrics";
  return absl::OkStatus();
}

}  // namespace asympo::daemon
