#include "common/daemon/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <prometheus/text_serializer.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace asympo::daemon {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// A resolved listening address.
struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

// Numeric addresses resolve as themselves; names to their first IPv4
// address, else their first IPv6 one.
absl::StatusOr<Endpoint> Resolve(const std::string& host, int port, const std::string& address) {
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
  Endpoint e;
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

// "ip:port" or "[ip6]:port" of a bound socket.
std::string Printable(int fd, int* port) {
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

int RemainingMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// Reads the request head (up to the blank line) before `deadline`. False
// when the client closes, stalls or sends more than kMaxRequestHead bytes.
bool ReadHead(int fd, absl::Time deadline, std::string* head) {
  char buf[1024];
  while (head->find("\r\n\r\n") == std::string::npos && head->find("\n\n") == std::string::npos) {
    if (head->size() > kMaxRequestHead) return false;
    pollfd p{fd, POLLIN, 0};
    const int timeout = RemainingMillis(deadline);
    if (timeout == 0 || ::poll(&p, 1, timeout) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    head->append(buf, static_cast<size_t>(n));
  }
  return true;
}

// Sends all of `data` before `deadline`; false when the client goes away or
// does not read in time.
bool SendAll(int fd, const std::string& data, absl::Time deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    const int timeout = RemainingMillis(deadline);
    if (timeout == 0 || ::poll(&p, 1, timeout) <= 0 || (p.revents & (POLLERR | POLLHUP))) {
      return false;
    }
  }
  return true;
}

// A whole HTTP/1.1 response; `extra` holds further header lines, each
// ending in CRLF.
std::string Response(absl::string_view status, absl::string_view type, const std::string& body,
                     bool with_body = true, absl::string_view extra = "") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra,
                      "Connection: close\r\n\r\n", with_body ? body : std::string());
}

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

// Adds `labels` to every series of `families`, but for a label a series
// has already, and keeps each series' labels sorted by name, as
// prometheus-cpp's own are.
void AddLabels(const prometheus::Labels& labels, std::vector<prometheus::MetricFamily>& families) {
  for (prometheus::MetricFamily& family : families) {
    for (prometheus::ClientMetric& metric : family.metric) {
      std::vector<prometheus::ClientMetric::Label>& own = metric.label;
      for (const auto& [name, value] : labels) {
        const bool has = std::any_of(own.begin(), own.end(),
                                     [&name = name](const auto& l) { return l.name == name; });
        if (!has) own.push_back({name, value});
      }
      std::sort(own.begin(), own.end(),
                [](const auto& a, const auto& b) { return a.name < b.name; });
    }
  }
}

}  // namespace

struct MetricsEndpoint::Server {
  ~Server();
  void AcceptLoop();
  void WorkerLoop();
  // Answers one request on `fd`.
  void Serve(int fd);
  std::string Answer(const std::string& head) const;
  // Waits `d`, or less if stopping.
  void Wait(absl::Duration d);

  MetricsEndpointOptions options;
  std::shared_ptr<prometheus::Registry> registry;
  int listen_fd = -1;
  int wake_fd = -1;  // an eventfd: written once, at stop
  int port = 0;
  std::string bound_address;
  std::thread acceptor;
  std::vector<std::thread> workers;

  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::deque<int> pending ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<int> serving ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    const MetricsEndpointOptions& options) {
  if (registry == nullptr) return absl::InvalidArgumentError("metrics endpoint without a registry");
  if (options.threads <= 0 || options.max_pending < 0 ||
      options.request_timeout <= absl::ZeroDuration() ||
      options.send_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "metrics endpoint: threads and the timeouts must be > 0, max_pending >= 0");
  }
  auto host_port = SplitHostPort(address);
  if (!host_port.ok()) return host_port.status();
  auto endpoint = Resolve(host_port->first, host_port->second, address);
  if (!endpoint.ok()) return endpoint.status();
  auto server = std::make_unique<Server>();
  server->options = options;
  server->registry = std::move(registry);
  server->listen_fd = ::socket(endpoint->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  if (server->listen_fd >= 0) {
    ::setsockopt(server->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  if (server->listen_fd < 0 ||
      ::bind(server->listen_fd, reinterpret_cast<const sockaddr*>(&endpoint->addr),
             endpoint->len) != 0 ||
      ::listen(server->listen_fd, 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", std::strerror(errno)));
  }
  server->wake_fd = ::eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd < 0) {
    return absl::InternalError(absl::StrCat("metrics endpoint: eventfd: ", std::strerror(errno)));
  }
  server->bound_address = Printable(server->listen_fd, &server->port);
  Server* s = server.get();
  for (int i = 0; i < options.threads; ++i) s->workers.emplace_back([s] { s->WorkerLoop(); });
  s->acceptor = std::thread([s] { s->AcceptLoop(); });
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(server)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Server> server) : server_(std::move(server)) {}
MetricsEndpoint::~MetricsEndpoint() = default;
int MetricsEndpoint::port() const { return server_->port; }
const std::string& MetricsEndpoint::bound_address() const { return server_->bound_address; }

MetricsEndpoint::Server::~Server() {
  {
    absl::MutexLock lock(&mu);
    stop = true;
    // Wakes workers blocked on a client: their recv/send/poll return.
    for (int fd : serving) ::shutdown(fd, SHUT_RDWR);
  }
  if (wake_fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }
  if (acceptor.joinable()) acceptor.join();
  for (std::thread& w : workers) w.join();
  for (int fd : pending) ::close(fd);
  if (listen_fd >= 0) ::close(listen_fd);
  if (wake_fd >= 0) ::close(wake_fd);
}

void MetricsEndpoint::Server::Wait(absl::Duration d) {
  pollfd p{wake_fd, POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(d)));
}

void MetricsEndpoint::Server::AcceptLoop() {
  int64_t accept_errors = 0;
  while (true) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents != 0) break;  // stopping
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the listener stays open; wait a
      // little rather than spin, and try again.
      if (accept_errors++ % 100 == 0) {
        LOG(WARNING) << "metrics endpoint " << bound_address << ": accept: " << std::strerror(errno)
                     << " (" << accept_errors << " so far)";
      }
      Wait(absl::Milliseconds(100));
      continue;
    }
    bool busy;
    {
      absl::MutexLock lock(&mu);
      if (stop) {
        ::close(fd);
        break;
      }
      busy = static_cast<int>(pending.size()) >= options.max_pending;
      if (!busy) pending.push_back(fd);
    }
    if (busy) {
      SendAll(fd, Response("503 Service Unavailable", "text/plain", "metrics endpoint busy\n"),
              absl::Now() + absl::Milliseconds(100));
      ::close(fd);
    }
  }
}

void MetricsEndpoint::Server::WorkerLoop() {
  while (true) {
    int fd;
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](Server* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->stop || !s->pending.empty(); },
          this));
      if (stop) return;
      fd = pending.front();
      pending.pop_front();
      serving.insert(fd);
    }
    Serve(fd);
    absl::MutexLock lock(&mu);
    serving.erase(fd);
    ::close(fd);
  }
}

void MetricsEndpoint::Server::Serve(int fd) {
  std::string head;
  if (!ReadHead(fd, absl::Now() + options.request_timeout, &head)) {
    // A head that never ends or is too long gets an answer; a client that
    // left does not.
    if (head.size() > kMaxRequestHead) {
      SendAll(fd, Response("431 Request Header Fields Too Large", "text/plain", "too long\n"),
              absl::Now() + options.send_timeout);
    }
    return;
  }
  SendAll(fd, Answer(head), absl::Now() + options.send_timeout);
}

std::string MetricsEndpoint::Server::Answer(const std::string& head) const {
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[1][0] != '/' ||
      !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Response("400 Bad Request", "text/plain", "malformed request line\n");
  }
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") {
    return Response("404 Not Found", "text/plain", "only /metrics is served here\n");
  }
  const bool head_only = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head_only) {
    return Response("405 Method Not Allowed", "text/plain", "only GET and HEAD\n", true,
                    "Allow: GET, HEAD\r\n");
  }
  std::vector<prometheus::MetricFamily> families = registry->Collect();
  if (!options.labels.empty()) AddLabels(options.labels, families);
  return Response("200 OK", kMetricsContentType,
                  prometheus::TextSerializer().Serialize(families), !head_only);
}

}  // namespace asympo::daemon
