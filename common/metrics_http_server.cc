#include "common/metrics_http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <prometheus/text_serializer.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace asympo {
namespace {

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    sent += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\" is not host:port"));
  }
  const std::string host = address.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), nullptr, &hints, &res) != 0 ||
      res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve metrics host \"", host, "\""));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 16) != 0) {
    const std::string err = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, ntohs(addr.sin_port), std::move(registry)));
}

MetricsHttpServer::MetricsHttpServer(int fd, int port,
                                     std::shared_ptr<prometheus::Registry> registry)
    : fd_(fd), port_(port), registry_(std::move(registry)), thread_([this] { Serve(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  thread_.join();
  ::close(fd_);
}

void MetricsHttpServer::Serve() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    Answer(client);
    ::close(client);
  }
}

void MetricsHttpServer::Answer(int client) {
  // Read the request head (up to 8 KiB, 2 s).
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
    pollfd p{client, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) return;
    const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  const bool metrics = request.rfind("GET /metrics", 0) == 0;
  std::string body, status = "404 Not Found", type = "text/plain";
  if (metrics) {
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
    status = "200 OK";
    type = "text/plain; version=0.0.4; charset=utf-8";
  } else {
    body = "only GET /metrics is served here\n";
  }
  SendAll(client,
          absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                       "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace asympo
