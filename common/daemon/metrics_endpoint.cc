#include "common/daemon/metrics_endpoint.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/daemon/metrics_address.h"
#include "common/daemon/metrics_http.h"
#include "common/listener/host_port.h"

namespace asympo::daemon {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// New connections taken in one turn of the loop, so that a flood of them
// cannot keep the loop from the connections it holds.
constexpr int kAcceptsPerTurn = 64;
// How long accepting pauses when accept() fails for want of descriptors or
// memory (the connections held go on meanwhile).
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

// A client connection; only the loop thread touches it.
struct Connection {
  enum class State {
    kReading,    // its request head, until `deadline`
    kAnswering,  // a worker prepares the answer to a scrape
    kWriting,    // `out`, until `deadline`
  };
  int fd = -1;
  State state = State::kReading;
  absl::Time deadline;
  std::string in;  // the head so far
  std::string out;
  size_t sent = 0;
};
using Connections = std::map<uint64_t, Connection>;  // by accept order

// Milliseconds from now to `deadline`, rounded up, for poll(); -1 (no
// limit) for an infinite one.
int MillisUntil(absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return -1;
  if (deadline <= now) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(deadline - now, absl::Milliseconds(1))), 1 << 30));
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
  // The loop thread: accepts, reads heads and writes answers for every
  // connection at once, and hands scrapes to the workers.
  void Loop();
  void WorkerLoop();
  // The 200 answer to a scrape (a worker's part: it collects the registry).
  std::string Scrape(bool head_only) const;
  // The answer to GET or HEAD /ready (options.ready).
  std::string ReadyAnswer(bool head_only) const;

  // The loop thread's steps.
  void AcceptSome(absl::Time now);
  // Closes the oldest connection not with a worker; false when there is none.
  bool MakeRoom();
  void ReadFrom(Connections::iterator it, absl::Time now);
  void StartWriting(Connections::iterator it, std::string answer, absl::Time now);
  void WriteTo(Connections::iterator it);
  // Takes the workers' answers; false when stopping.
  bool TakeAnswers(absl::Time now);
  void CloseExpired(absl::Time now);
  void Close(Connections::iterator it);

  MetricsEndpointOptions options;
  std::shared_ptr<prometheus::Registry> registry;
  int listen_fd = -1;
  int wake_fd = -1;  // an eventfd: written at stop and by a worker with an answer
  int port = 0;
  std::string bound_address;
  std::thread loop;
  std::vector<std::thread> workers;

  // The loop thread's own.
  Connections connections;
  uint64_t next_id = 0;
  int answering = 0;  // connections in State::kAnswering
  absl::Time accept_paused_until = absl::InfinitePast();
  int64_t accept_errors = 0;
  int64_t evicted = 0;

  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  // Scrapes for the workers: connection id, HEAD.
  std::deque<std::pair<uint64_t, bool>> scrapes ABSL_GUARDED_BY(mu);
  // The workers' answers: connection id, response.
  std::vector<std::pair<uint64_t, std::string>> answers ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    const MetricsEndpointOptions& options) {
  if (registry == nullptr) return absl::InvalidArgumentError("metrics endpoint without a registry");
  if (options.threads <= 0 || options.max_pending < 0 || options.max_connections <= 0 ||
      options.request_timeout <= absl::ZeroDuration() ||
      options.send_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "metrics endpoint: threads, max_connections and the timeouts must be > 0, "
        "max_pending >= 0");
  }
  absl::StatusOr<ListenAddress> endpoint = ResolveListenAddress(address);
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
      ::listen(server->listen_fd, SOMAXCONN) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", std::strerror(errno)));
  }
  server->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (server->wake_fd < 0) {
    return absl::InternalError(absl::StrCat("metrics endpoint: eventfd: ", std::strerror(errno)));
  }
  server->bound_address = BoundAddress(server->listen_fd, &server->port);
  Server* s = server.get();
  for (int i = 0; i < options.threads; ++i) s->workers.emplace_back([s] { s->WorkerLoop(); });
  s->loop = std::thread([s] { s->Loop(); });
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
  }
  if (wake_fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }
  // The loop closes the connections it holds as it ends.
  if (loop.joinable()) loop.join();
  for (std::thread& w : workers) w.join();
  if (listen_fd >= 0) ::close(listen_fd);
  if (wake_fd >= 0) ::close(wake_fd);
}

void MetricsEndpoint::Server::Loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // the connection of fds[i + 2]
  while (true) {
    absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until;
    absl::Time next = accepting ? absl::InfiniteFuture() : accept_paused_until;
    fds.assign({{wake_fd, POLLIN, 0}, {accepting ? listen_fd : -1, POLLIN, 0}});
    ids.clear();
    for (const auto& [id, c] : connections) {
      if (c.state == Connection::State::kAnswering) continue;
      fds.push_back(
          {c.fd, static_cast<short>(c.state == Connection::State::kReading ? POLLIN : POLLOUT), 0});
      ids.push_back(id);
      next = std::min(next, c.deadline);
    }
    if (::poll(fds.data(), fds.size(), MillisUntil(next, now)) < 0 && errno != EINTR) {
      PLOG(ERROR) << "metrics endpoint " << bound_address << ": poll; no longer serving";
      break;
    }
    now = absl::Now();
    if (fds[0].revents != 0 && !TakeAnswers(now)) break;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      const auto it = connections.find(ids[i]);
      DCHECK(it != connections.end());  // only its own step closes a connection
      if (it->second.state == Connection::State::kReading) {
        ReadFrom(it, now);
      } else {
        WriteTo(it);
      }
    }
    if (fds[1].revents != 0) AcceptSome(now);
    CloseExpired(absl::Now());
  }
  for (const auto& [id, c] : connections) ::close(c.fd);
  connections.clear();
}

void MetricsEndpoint::Server::AcceptSome(absl::Time now) {
  for (int i = 0; i < kAcceptsPerTurn; ++i) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: rather than spin, pause accepting.
      if (accept_errors++ % 100 == 0) {
        LOG(WARNING) << "metrics endpoint " << bound_address << ": accept: " << std::strerror(errno)
                     << " (" << accept_errors << " so far)";
      }
      accept_paused_until = now + kAcceptPause;
      return;
    }
    if (static_cast<int>(connections.size()) >= options.max_connections && !MakeRoom()) {
      const std::string busy = http::Busy();
      [[maybe_unused]] ssize_t n = ::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
      ::close(fd);
      continue;
    }
    Connection c;
    c.fd = fd;
    c.deadline = now + options.request_timeout;
    // The request has often come with the connection: read it at once, so
    // that a scrape does not wait in the queue of idle connections.
    ReadFrom(connections.emplace(next_id++, std::move(c)).first, now);
  }
}

bool MetricsEndpoint::Server::MakeRoom() {
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    if (it->second.state == Connection::State::kAnswering) continue;
    if (evicted++ % 1000 == 0) {
      LOG(WARNING) << "metrics endpoint " << bound_address << ": " << connections.size()
                   << " connections held, the most allowed; closing the oldest (" << evicted
                   << " so far)";
    }
    if (it->second.state == Connection::State::kReading) {
      const std::string busy = http::Busy();
      [[maybe_unused]] ssize_t n = ::send(it->second.fd, busy.data(), busy.size(), MSG_NOSIGNAL);
    }
    Close(it);
    return true;
  }
  return false;
}

void MetricsEndpoint::Server::ReadFrom(Connections::iterator it, absl::Time now) {
  Connection& c = it->second;
  const size_t before = c.in.size();
  bool eof = false;
  char buf[4096];
  while (!eof && c.in.size() <= http::kMaxRequestHead) {
    // Never more than one byte past the limit: enough to tell it was passed.
    const size_t want = std::min(sizeof(buf), http::kMaxRequestHead + 1 - c.in.size());
    const ssize_t n = ::recv(c.fd, buf, want, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      eof = true;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else if (errno != EINTR) {
      Close(it);  // reset by the client
      return;
    }
  }
  if (eof && c.in.empty()) {  // a port check, say: nothing to answer
    Close(it);
    return;
  }
  // A verdict can only change with a line end, the limit or the end.
  if (!eof && c.in.size() <= http::kMaxRequestHead &&
      c.in.find('\n', before) == std::string::npos) {
    return;
  }
  http::Verdict verdict = http::Judge(c.in, eof);
  if (verdict.kind == http::Verdict::Kind::kAnswer) {
    StartWriting(it, std::move(verdict.answer), now);
  } else if (verdict.kind == http::Verdict::Kind::kReady) {
    StartWriting(it, ReadyAnswer(verdict.head_only), now);
  } else if (verdict.kind == http::Verdict::Kind::kScrape) {
    if (answering >= options.threads + options.max_pending) {
      StartWriting(it, http::Busy(), now);
      return;
    }
    c.state = Connection::State::kAnswering;
    c.in = std::string();
    ++answering;
    absl::MutexLock lock(&mu);
    scrapes.emplace_back(it->first, verdict.head_only);
  }
}

void MetricsEndpoint::Server::StartWriting(Connections::iterator it, std::string answer,
                                           absl::Time now) {
  Connection& c = it->second;
  c.state = Connection::State::kWriting;
  c.in = std::string();
  c.out = std::move(answer);
  c.sent = 0;
  c.deadline = now + options.send_timeout;
  WriteTo(it);
}

void MetricsEndpoint::Server::WriteTo(Connections::iterator it) {
  Connection& c = it->second;
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // poll() says when the client has taken some
    } else if (n == 0 || errno != EINTR) {
      break;  // the client went away
    }
  }
  Close(it);
}

bool MetricsEndpoint::Server::TakeAnswers(absl::Time now) {
  uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(wake_fd, &count, sizeof(count));
  std::vector<std::pair<uint64_t, std::string>> ready;
  {
    absl::MutexLock lock(&mu);
    if (stop) return false;
    ready.swap(answers);
  }
  for (auto& [id, answer] : ready) {
    const auto it = connections.find(id);
    CHECK(it != connections.end() && it->second.state == Connection::State::kAnswering);
    --answering;
    StartWriting(it, std::move(answer), now);
  }
  return true;
}

void MetricsEndpoint::Server::CloseExpired(absl::Time now) {
  for (auto it = connections.begin(); it != connections.end();) {
    const Connection& c = it->second;
    // A client that has not sent its head in time is dropped unanswered.
    if (c.state != Connection::State::kAnswering && c.deadline <= now) {
      Close(it++);
    } else {
      ++it;
    }
  }
}

void MetricsEndpoint::Server::Close(Connections::iterator it) {
  ::close(it->second.fd);
  connections.erase(it);
}

void MetricsEndpoint::Server::WorkerLoop() {
  while (true) {
    std::pair<uint64_t, bool> scrape;
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](Server* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->stop || !s->scrapes.empty(); },
          this));
      if (stop) return;
      scrape = scrapes.front();
      scrapes.pop_front();
    }
    std::string answer = Scrape(scrape.second);
    {
      absl::MutexLock lock(&mu);
      if (stop) return;
      answers.emplace_back(scrape.first, std::move(answer));
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }
}

std::string MetricsEndpoint::Server::ReadyAnswer(bool head_only) const {
  if (!options.ready) {
    return http::Response("404 Not Found", "text/plain", "no readiness check here\n", !head_only);
  }
  const absl::Status s = options.ready();
  if (s.ok()) return http::Response("200 OK", "text/plain", "ready\n", !head_only);
  return http::Response("503 Service Unavailable", "text/plain",
                        absl::StrCat("not ready: ", s.message(), "\n"), !head_only);
}

std::string MetricsEndpoint::Server::Scrape(bool head_only) const {
  std::vector<prometheus::MetricFamily> families = registry->Collect();
  if (!options.labels.empty()) AddLabels(options.labels, families);
  return http::Response("200 OK", kMetricsContentType,
                        prometheus::TextSerializer().Serialize(families), !head_only);
}

}  // namespace asympo::daemon
