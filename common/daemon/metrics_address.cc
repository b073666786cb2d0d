#include "common/daemon/metrics_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/listener/host_port.h"

namespace asympo::daemon {
namespace {

// Numeric addresses resolve as themselves; names to their first IPv4
// address, else their first IPv6 one.
absl::StatusOr<ListenAddress> Resolve(const std::string& host, int port,
                                      const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", address, "\": host \"",
                                                   host, "\" does not resolve (",
                                                   ::gai_strerror(rc), ")"));
  }
  const addrinfo* pick = nullptr;
  for (const addrinfo* a = res; a != nullptr && pick == nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) pick = a;
  }
  for (const addrinfo* a = res; a != nullptr && pick == nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET6) pick = a;
  }
  ListenAddress e;
  if (pick != nullptr) {
    std::memcpy(&e.addr, pick->ai_addr, pick->ai_addrlen);
    e.len = pick->ai_addrlen;
    e.family = pick->ai_family;
  }
  ::freeaddrinfo(res);
  if (pick == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": host \"", host, "\" has no IP address"));
  }
  return e;
}

}  // namespace

absl::StatusOr<ListenAddress> ResolveListenAddress(const std::string& address) {
  absl::StatusOr<HostPort> host_port = SplitHostPort(address, "metrics address");
  if (!host_port.ok()) return host_port.status();
  return Resolve(host_port->host, host_port->port, address);
}

}  // namespace asympo::daemon
