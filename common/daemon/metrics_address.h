// The address MetricsEndpoint (metrics_endpoint.h) listens on, written
// "host:port" (common/listener/host_port.h splits it): resolving it. Only the
// endpoint uses it. Thread-safe functions.
#pragma once

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"

namespace asympo::daemon {

// A resolved address, ready for bind().
struct ListenAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

// `address` is "host:port": host an IPv4 address, a bracketed IPv6 address
// or a name (its first IPv4 address, else its first IPv6 one); port
// 0..65535. INVALID_ARGUMENT naming `address` and the rule otherwise.
absl::StatusOr<ListenAddress> ResolveListenAddress(const std::string& address);

}  // namespace asympo::daemon
