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
// Served, over IPv4 or IPv6: GET and HEAD of exactly /metrics, with or
// without a "?query" (ignored), and of /ready, the daemon's readiness
// (MetricsEndpointOptions::ready: 200 "ready", or 503 with the reason; 404
// without it), answered on the polling thread. The request head must be strict HTTP/1.x:
// a request line `method SP path SP HTTP/1.<digit> CRLF` (method a token,
// path from '/' in visible ASCII), header lines ending in CRLF, a blank
// line; 8 KiB (8,192 bytes) at most in all. Answers: 200; 404 for any
// other path (/metricsX, /metrics/, /metrics/../x); 405 for another
// method; 400 for any other request line, a CR or LF that stands alone,
// or a head that the client ends early; 431 for a head over 8 KiB; 503
// when busy (below). Answers to HEAD have no body. Each connection answers
// one request and closes.
//
// Slow or idle clients cannot hold up scrapes: one thread reads the request
// heads and writes the answers of every connection at once (poll), and only
// complete scrapes go to the `threads` workers that collect the registry. A
// client has request_timeout from the moment its connection is accepted to send
// its whole head (bytes that keep coming do not extend it), and send_timeout
// from the moment its answer is ready to take all of it; past either it is
// closed (a late head gets no answer). At most max_connections are held at
// once: one more closes the oldest that is not with a worker (with a 503 if it
// was still sending its head), or gets 503 itself when every one is. A scrape
// that finds threads + max_pending scrapes with the workers gets 503.
//
// Thread-safe; the destructor stops accepting, closes every connection and
// joins every thread, promptly (no polling interval).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <prometheus/labels.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asympo::daemon {

struct MetricsEndpointOptions {
  // Worker threads: registries collected at once.
  int threads = 2;
  // Complete scrapes waiting for a worker; beyond them, 503.
  int max_pending = 16;
  // Connections held at once, whatever their state; beyond them the oldest
  // is closed.
  int max_connections = 128;
  // How long a client may take to send its whole request head (at most
  // 8 KiB), counted from the accept; and to take the whole answer, counted
  // from when it is ready.
  absl::Duration request_timeout = absl::Seconds(5);
  absl::Duration send_timeout = absl::Seconds(10);
  // Labels added to every series served (for example {"run", "exp-7"}); a
  // series that has a label of that name already keeps its own value.
  prometheus::Labels labels;
  // GET /ready: OK for 200, an error for 503 with its message. Called on the
  // polling thread: it must not wait (read what others record). Empty:
  // /ready is 404.
  std::function<absl::Status()> ready;
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
