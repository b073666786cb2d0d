// The Prometheus endpoint of a daemon: GET /metrics in the text exposition
// format (version 0.0.4) from a prometheus-cpp registry the caller owns.
// main() owns both the registry and this endpoint and hands the registry to
// the daemon by reference.
//
// Why not prometheus-cpp's Exposer: its civetweb starts worker threads with
// a fixed 100 KiB stack, and glibc refuses to create a thread whose stack
// cannot also hold the process's static TLS. Debian's LibTorch with
// OpenBLAS brings more than that (libopenblas alone 60 KiB, glog 30 KiB),
// so the Exposer fails to start in the daemons ("null context when
// constructing CivetServer"); tests/common/daemon/exposer_reproducer_test.cc
// shows it.
//
// Served: GET and HEAD of /metrics (a query string is ignored); other paths
// get 404, other methods 405, a request line that does not parse 400. Each
// connection answers one request and closes. Several scrapes are served at
// once (`threads` workers), over IPv4 or IPv6. A client that does not send
// its request within request_timeout, or does not take the answer within
// send_timeout, is dropped without holding up the others. When every
// worker is busy and `max_pending` connections wait, new ones get 503.
//
// Thread-safe; the destructor stops accepting, drops the connections in
// progress and joins every thread, promptly (no polling interval).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <prometheus/labels.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asympo::daemon {

struct MetricsEndpointOptions {
  // Worker threads: scrapes served at once.
  int threads = 2;
  // Accepted connections waiting for a worker; beyond them, 503.
  int max_pending = 16;
  // How long a client may take to send its request head (at most 8 KiB),
  // and to take the answer.
  absl::Duration request_timeout = absl::Seconds(5);
  absl::Duration send_timeout = absl::Seconds(10);
  // Labels added to every series served (for example {"run", "exp-7"}); a
  // series that has a label of that name already keeps its own value.
  prometheus::Labels labels;
};

class MetricsEndpoint {
 public:
  // Serves `registry` on `address`, "host:port": host is an IPv4 address
  // (0.0.0.0 for every interface), a bracketed IPv6 address ([::1], [::])
  // or a name such as localhost (its first address); port 0 picks a free
  // port (see port()). INVALID_ARGUMENT naming the address when it is
  // malformed or its host does not resolve; UNAVAILABLE naming it when it
  // cannot be bound (for example, in use).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      const MetricsEndpointOptions& options = {});
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The bound port.
  int port() const;
  // The address actually bound: "ip:port" or "[ip6]:port".
  const std::string& bound_address() const;

 private:
  struct Server;
  explicit MetricsEndpoint(std::unique_ptr<Server> server);

  std::unique_ptr<Server> server_;
};

}  // namespace asympo::daemon
