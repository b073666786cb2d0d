#include "common/listener/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace asympo {

namespace {

constexpr absl::string_view kExpected =
    "expected host:port, e.g. 127.0.0.1:8000, [::1]:8000 or 0.0.0.0:8000";

// What is wrong with `address` as host:port ("has no port", ...), or empty
// when nothing is; fills *out.
std::string HostPortProblem(const std::string& address, HostPort* out) {
  if (address.empty()) return "is empty";
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "has no port";
  out->host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  const bool digits = !port_text.empty() && port_text.size() <= 5 &&
                      std::all_of(port_text.begin(), port_text.end(), [](char c) {
                        return absl::ascii_isdigit(static_cast<unsigned char>(c));
                      });
  if (!digits || !absl::SimpleAtoi(port_text, &out->port) || out->port > 65535) {
    return "has no valid port (0..65535)";
  }
  std::string& host = out->host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr ignored;
    if (::inet_pton(AF_INET6, host.c_str(), &ignored) != 1) return "has a bad IPv6 address";
  } else if (host.find_first_of(":[]") != std::string::npos) {
    return "has an IPv6 address without brackets";
  }
  if (host.empty()) return "has no host (0.0.0.0 serves every interface)";
  return "";
}

}  // namespace

absl::StatusOr<HostPort> SplitHostPort(const std::string& address, absl::string_view what) {
  HostPort out;
  const std::string problem = HostPortProblem(address, &out);
  if (problem.empty()) return out;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " \"", address, "\" ", problem, "; ", kExpected));
}

absl::Status CheckAddressFlag(absl::string_view flag, const std::string& address) {
  HostPort ignored;
  const std::string problem = HostPortProblem(address, &ignored);
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", address, ": ", problem, "; ", kExpected));
}

std::string BoundAddress(int fd, int* port) {
  *port = 0;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    *port = ntohs(a->sin6_port);
    return absl::StrCat("[", buf, "]:", *port);
  }
  if (addr.ss_family != AF_INET) return "";
  const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
  ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
  *port = ntohs(a->sin_port);
  return absl::StrCat(buf, ":", *port);
}

bool IsLoopbackAddress(absl::string_view address) {
  std::string host;
  if (absl::ConsumePrefix(&address, "[")) {
    host = std::string(address.substr(0, address.find(']')));
  } else {
    const size_t colon = address.rfind(':');
    // Several colons without brackets: a bare IPv6 address.
    const bool has_port = colon != absl::string_view::npos && address.find(':') == colon;
    host = std::string(has_port ? address.substr(0, colon) : address);
  }
  host = absl::AsciiStrToLower(host);
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

}  // namespace asympo
