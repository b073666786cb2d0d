#include "common/daemon/metrics_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace asympo::daemon {
namespace {

// Splits "host:port": the host without brackets and the port (0..65535).
// INVALID_ARGUMENT naming `address` otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\" ", why,
                     "; expected host:port, e.g. 127.0.0.1:9464, [::1]:9464 or 0.0.0.0:9464"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return bad("has no port");
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  int port = -1;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return bad("has no valid port (0..65535)");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr ignored;
    if (::inet_pton(AF_INET6, host.c_str(), &ignored) != 1) return bad("has a bad IPv6 address");
  } else if (host.find_first_of(":[]") != std::string::npos) {
    return bad("has an IPv6 address without brackets");
  }
  if (host.empty()) return bad("has no host (0.0.0.0 serves every interface)");
  return std::make_pair(host, port);
}

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
  auto host_port = SplitHostPort(address);
  if (!host_port.ok()) return host_port.status();
  return Resolve(host_port->first, host_port->second, address);
}

std::string BoundAddress(int fd, int* port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    *port = ntohs(a->sin6_port);
    return absl::StrCat("[", buf, "]:", *port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
  ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
  *port = ntohs(a->sin_port);
  return absl::StrCat(buf, ":", *port);
}

}  // namespace asympo::daemon
