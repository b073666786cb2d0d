// A minimal HTTP endpoint that serves GET /metrics in the Prometheus text
// exposition format (version 0.0.4) from a prometheus-cpp registry.
//
// prometheus-cpp's Exposer (civetweb) fails to start in processes that also
// load Debian's LibTorch ("null context when constructing CivetServer"), so
// the daemons serve their metrics with this instead. One thread accepts and
// answers requests one at a time, which is all a scraper needs.
// Thread-safe; stops and joins its thread on destruction.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace asympo {

class MetricsHttpServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one; host may be
  // an IPv4 address, "localhost" or "0.0.0.0"). UNAVAILABLE naming the
  // address when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer(int fd, int port, std::shared_ptr<prometheus::Registry> registry);
  void Serve();
  void Answer(int client);

  int fd_;
  int port_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace asympo
