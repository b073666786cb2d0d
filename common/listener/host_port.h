// "host:port" socket addresses as the daemons' listening options take them:
// splitting one, and printing the address a socket is bound to. Pure
// functions, thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asympo {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 address
  int port = 0;      // 0..65535
};

// Splits "host:port": host is an IPv4 address, a bracketed IPv6 address
// ([::1]) or a name; port is 0..65535. INVALID_ARGUMENT otherwise, naming
// `what` (e.g. "metrics address"), the address and the rule.
absl::StatusOr<HostPort> SplitHostPort(const std::string& address, absl::string_view what);

// The same rules for a flag that takes host:port, before anything binds or
// connects: INVALID_ARGUMENT "--FLAG=ADDRESS: has no port; expected
// host:port, ..." (an empty address "is empty"). A gRPC client would take
// "localhost" as port 443 and retry it forever.
absl::Status CheckAddressFlag(absl::string_view flag, const std::string& address);

// "ip:port" or "[ip6]:port" of the socket `fd` is bound to; its port goes
// to *port. "" and 0 when fd is not a bound IP socket.
std::string BoundAddress(int fd, int* port);

// Whether "host:port" (or a bare host) names a loopback host: 127.0.0.0/8,
// [::1] or localhost. Any other name, 0.0.0.0 and [::] are not loopback:
// what the daemons may serve in plaintext without --insecure.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace asympo
