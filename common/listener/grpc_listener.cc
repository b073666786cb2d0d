#include "common/listener/grpc_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/listener/host_port.h"
#include "common/listener/socket_bytes.h"

namespace asympo {
namespace {

// Connections taken from the backlog before the accept thread polls again.
constexpr int kAcceptBatch = 256;
// At the connection limit, how often the open connections are counted again.
constexpr absl::Duration kPruneInterval = absl::Milliseconds(10);

std::string ErrnoText(int error) {
  return absl::StrCat(std::strerror(error), " (errno ", error, ")");
}

struct Resolved {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

// Every address `host` has (a numeric one: itself), each once.
absl::StatusOr<std::vector<Resolved>> ResolveAll(const HostPort& hp, const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(hp.host.c_str(), std::to_string(hp.port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC address \"", address, "\": host \"",
                                                   hp.host, "\" does not resolve (",
                                                   ::gai_strerror(rc), ")"));
  }
  std::vector<Resolved> out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    Resolved r;
    std::memcpy(&r.addr, a->ai_addr, a->ai_addrlen);
    r.len = a->ai_addrlen;
    r.family = a->ai_family;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Resolved& o) {
      return o.len == r.len && std::memcmp(&o.addr, &r.addr, r.len) == 0;
    });
    if (!seen) out.push_back(r);
  }
  ::freeaddrinfo(res);
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gRPC address \"", address, "\": host \"", hp.host, "\" has no IP address"));
  }
  return out;
}

void SetPort(Resolved* r, int port) {
  if (r->family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&r->addr)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in*>(&r->addr)->sin_port = htons(static_cast<uint16_t>(port));
  }
}

// A non-blocking listening socket on `r`, or -1 with *error set. With
// `v6only` an IPv6 socket leaves IPv4 to a socket of its own. SO_REUSEADDR
// (a restart need not wait out TIME_WAIT), never SO_REUSEPORT.
int Listen(const Resolved& r, bool v6only, int* error) {
  const int fd = ::socket(r.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno;
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (r.family == AF_INET6) {
    const int v6 = v6only ? 1 : 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6, sizeof(v6));
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&r.addr), r.len) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    *error = errno;
    ::close(fd);
    return -1;
  }
  return fd;
}

// Listening sockets on every address, on one port (the first one's when
// the port is 0). UNAVAILABLE when an address is in use or none binds.
absl::StatusOr<std::vector<int>> ListenOnAll(std::vector<Resolved> addrs,
                                             const std::string& address) {
  std::vector<int> fds;
  int port = 0;
  int first_error = 0;
  for (Resolved& r : addrs) {
    if (port != 0) SetPort(&r, port);
    int error = 0;
    const int fd = Listen(r, addrs.size() > 1, &error);
    if (fd < 0 && (error == EADDRNOTAVAIL || error == EAFNOSUPPORT)) {
      if (first_error == 0) first_error = error;
      continue;  // e.g. localhost's ::1 on a host without IPv6
    }
    if (fd < 0) {
      for (const int f : fds) ::close(f);
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on ", address, ": ", ErrnoText(error),
          error == EADDRINUSE ? "; another process (a second daemon?) holds the port" : ""));
    }
    fds.push_back(fd);
    if (port == 0) BoundAddress(fd, &port);
  }
  if (fds.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", ErrnoText(first_error)));
  }
  return fds;
}

// The inode of the socket `fd` names; 0 when it names none.
uint64_t SocketInode(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// gRPC's peer string for `a` (its grpc_sockaddr_to_uri: an IPv4-mapped
// IPv6 address as IPv4) and the bare address, for the connection table.
void PeerOf(const sockaddr_storage& a, std::string* peer, std::string* address) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    const int port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      ::inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof(text));
      *address = text;
      *peer = absl::StrCat("ipv4:", text, ":", port);
      return;
    }
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    *address = text;
    if (in6->sin6_scope_id != 0) absl::StrAppend(address, "%", in6->sin6_scope_id);
    *peer = absl::StrCat("ipv6:[", *address, "]:", port);
    return;
  }
  const auto* in4 = reinterpret_cast<const sockaddr_in*>(&a);
  ::inet_ntop(AF_INET, &in4->sin_addr, text, sizeof(text));
  *address = text;
  *peer = absl::StrCat("ipv4:", text, ":", ntohs(in4->sin_port));
}

int OpenSpare() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Whether `listen_fd` has a connection waiting to be accepted.
bool HasPending(int listen_fd) {
  pollfd p{listen_fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

}  // namespace

int DefaultMaxConnections() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return kMaxConnectionsCap;
  }
  const int64_t soft = static_cast<int64_t>(limit.rlim_cur);
  return static_cast<int>(
      std::clamp<int64_t>(soft - kDescriptorsReservedFromConnections, 16, kMaxConnectionsCap));
}

absl::StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Bind(
    const std::string& address, std::shared_ptr<grpc::ServerCredentials> credentials,
    grpc::ServerBuilder* builder, GrpcListenerOptions options) {
  if (options.max_connections < 0 || options.max_connections_per_peer < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gRPC listener: max_connections is ", options.max_connections,
        " and max_connections_per_peer ", options.max_connections_per_peer, "; both must be >= 0"));
  }
  if (options.unauthenticated_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gRPC listener: unauthenticated_grace must be positive");
  }
  absl::StatusOr<HostPort> hp = SplitHostPort(address, "gRPC address");
  if (!hp.ok()) return hp.status();
  absl::StatusOr<std::vector<Resolved>> addrs = ResolveAll(*hp, address);
  if (!addrs.ok()) return addrs.status();
  absl::StatusOr<std::vector<int>> fds = ListenOnAll(*std::move(addrs), address);
  if (!fds.ok()) return fds.status();
  std::unique_ptr<GrpcListener> l(new GrpcListener());
  l->listen_fds_ = *std::move(fds);
  l->options_ = options;
  l->max_connections_ =
      options.max_connections > 0 ? options.max_connections : DefaultMaxConnections();
  ConnectionLimits limits;
  limits.max_connections = l->max_connections_;
  limits.max_per_peer = options.max_connections_per_peer > 0
                            ? options.max_connections_per_peer
                            : std::max(16, l->max_connections_ / 4);
  limits.max_per_peer = std::min(limits.max_per_peer, l->max_connections_);
  limits.grace = options.unauthenticated_grace;
  l->table_ = std::make_shared<ConnectionTable>(limits);
  l->bound_address_ = BoundAddress(l->listen_fds_.front(), &l->port_);
  l->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  l->spare_fd_ = OpenSpare();
  if (l->wake_fd_ < 0 || l->spare_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("gRPC listener on ", address, ": ", ErrnoText(errno)));
  }
  l->acceptor_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      std::move(credentials));
  return l;
}

GrpcListener::~GrpcListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    CHECK_EQ(::write(wake_fd_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
    thread_.join();
  }
  for (const int fd : listen_fds_) ::close(fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

void GrpcListener::Start() {
  CHECK(!thread_.joinable()) << "GrpcListener::Start called twice";
  LOG(INFO) << "gRPC listening on " << bound_address_ << " (at most " << max_connections_
            << " connections, " << table_->limits().max_per_peer << " from one address"
            << (table_->limits().grace == absl::InfiniteDuration()
                    ? std::string()
                    : absl::StrCat("; closed without an authorized call within ",
                                   absl::FormatDuration(table_->limits().grace)))
            << ")";
  thread_ = std::thread([this] { AcceptLoop(); });
}

GrpcListenerStats GrpcListener::stats() const {
  GrpcListenerStats s;
  s.accepted = accepted_.load();
  s.refused_at_limit = refused_at_limit_.load();
  s.refused_at_peer_limit = refused_at_peer_limit_.load();
  s.closed_unauthenticated = closed_unauthenticated_.load();
  s.descriptor_exhaustions = descriptor_exhaustions_.load();
  s.refused_without_descriptors = refused_without_descriptors_.load();
  s.other_accept_errors = other_accept_errors_.load();
  return s;
}

void GrpcListener::AcceptLoop() {
  std::vector<pollfd> polled = {{wake_fd_, POLLIN, 0}};
  for (const int fd : listen_fds_) polled.push_back({fd, POLLIN, 0});
  // With a grace, expired connections are looked for between accepts.
  const int timeout_ms = table_->limits().grace == absl::InfiniteDuration() ? -1 : 200;
  for (;;) {
    const int ready = ::poll(polled.data(), polled.size(), timeout_ms);
    if (ready < 0) {
      CHECK_EQ(errno, EINTR) << "poll: " << ErrnoText(errno);
      continue;
    }
    if (timeout_ms >= 0) CloseExpired();
    if (ready == 0) continue;
    if (polled[0].revents != 0) return;
    bool pause = false;
    for (size_t i = 1; i < polled.size(); ++i) {
      if (polled[i].revents != 0 && !AcceptPending(polled[i].fd)) pause = true;
    }
    if (pause && WaitOrStop(options_.exhausted_backoff)) return;
  }
}

bool GrpcListener::AcceptPending(int listen_fd) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(listen_fd, fd, peer);
      continue;
    }
    const int error = errno;
    switch (error) {
      case EAGAIN:
        return true;
      // The connection went away, or (Linux, accept(2)) a network error
      // already pending on it: the next one may be fine.
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        continue;
      case EMFILE:
      case ENFILE:
        ShedWithoutDescriptors(listen_fd, error);
        return false;
      default:  // ENOBUFS, ENOMEM: the kernel is short; try again later
        ++other_accept_errors_;
        Report(GrpcListenerEvent::kOtherAcceptError);
        MaybeLogRefusals(absl::StrCat("accept4: ", ErrnoText(error)));
        return false;
    }
  }
  return true;
}

void GrpcListener::Admit(int listen_fd, int fd, const sockaddr_storage& peer_addr) {
  std::string peer, address;
  PeerOf(peer_addr, &peer, &address);
  // A full check costs one fstat per open connection: at most one per
  // kPruneInterval, so that a flood at a limit costs little.
  const absl::Time now = absl::Now();
  const ConnectionLimits& limits = table_->limits();
  if ((table_->open() >= limits.max_connections ||
       table_->open_from(address) >= limits.max_per_peer) &&
      now - last_prune_ >= kPruneInterval) {
    table_->Prune([](int f, uint64_t inode) { return SocketInode(f) == inode; });
    last_prune_ = now;
  }
  // Recorded before gRPC has it: gRPC may close it at any time after.
  const ConnectionTable::Admission a = table_->Admit(fd, SocketInode(fd), peer, address, now);
  for (const ConnectionRef& c : a.evicted) CloseUnauthenticated(c);
  if (a.verdict != ConnectionTable::Verdict::kAdmitted) {
    const bool per_peer = a.verdict == ConnectionTable::Verdict::kRefusedAtPeerLimit;
    ++(per_peer ? refused_at_peer_limit_ : refused_at_limit_);  // before the client sees the close
    Report(per_peer ? GrpcListenerEvent::kRefusedAtPeerLimit : GrpcListenerEvent::kRefusedAtLimit);
    ::close(fd);
    MaybeLogRefusals(per_peer ? absl::StrCat(limits.max_per_peer, " connections open from ",
                                             address, ", the limit per address")
                              : absl::StrCat(max_connections_, " connections open, the limit"));
    return;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
  p.listener_fd = listen_fd;
  p.fd = fd;
  acceptor_->HandleNewConnection(&p);
  ++accepted_;
  Report(GrpcListenerEvent::kAccepted);
}

void GrpcListener::CloseExpired() {
  for (const ConnectionRef& c : table_->Expired(absl::Now(), SocketBytesReceived)) {
    CloseUnauthenticated(c);
  }
}

void GrpcListener::CloseUnauthenticated(const ConnectionRef& c) {
  // gRPC owns the descriptor: shutdown ends the connection, gRPC then
  // closes it. The inode check keeps a reused number's socket alone.
  if (SocketInode(c.fd) != c.inode) return;
  ::shutdown(c.fd, SHUT_RDWR);
  ++closed_unauthenticated_;
  Report(GrpcListenerEvent::kClosedUnauthenticated);
  MaybeLogRefusals("closing connections that made no authorized call in time or at a limit");
}

std::function<void(const std::string& peer)> GrpcListener::authorized_hook() const {
  return [table = table_](const std::string& peer) { table->MarkAuthorized(peer); };
}

void GrpcListener::ShedWithoutDescriptors(int listen_fd, int error) {
  ++descriptor_exhaustions_;
  Report(GrpcListenerEvent::kDescriptorExhaustion);
  if (spare_fd_ < 0) spare_fd_ = OpenSpare();
  for (int i = 0; i < kAcceptBatch && spare_fd_ >= 0 && HasPending(listen_fd); ++i) {
    // The reserve's slot is free only between these two calls: another
    // thread that opens a descriptor then takes it, and accept4 fails.
    ::close(spare_fd_);
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      spare_fd_ = OpenSpare();  // -1 if another thread took the slot; tried again next time
      break;
    }
    ++refused_without_descriptors_;
    Report(GrpcListenerEvent::kRefusedWithoutDescriptors);
    // Closes the connection and keeps its slot as the reserve in one step
    // (a copy of the eventfd), so that the slot is never free after the
    // last connection, where a thread opening descriptors would take it.
    if (::dup3(wake_fd_, fd, O_CLOEXEC) == fd) {
      spare_fd_ = fd;
    } else {
      ::close(fd);
      spare_fd_ = OpenSpare();
    }
  }
  MaybeLogRefusals(absl::StrCat("out of file descriptors (accept4: ", ErrnoText(error),
                                "; RLIMIT_NOFILE soft limit: raise ulimit -n)"));
}

void GrpcListener::MaybeLogRefusals(const std::string& why) {
  const absl::Time now = absl::Now();
  if (now - last_log_ < options_.log_interval) return;
  const GrpcListenerStats s = stats();
  const int64_t refused = s.refused_at_limit + s.refused_at_peer_limit +
                          s.refused_without_descriptors + s.closed_unauthenticated;
  LOG(WARNING) << "gRPC listener on " << bound_address_ << ": " << why << "; "
               << refused - logged_refusals_
               << " connections refused or closed since the last report (" << s.refused_at_limit
               << " at the limit, " << s.refused_at_peer_limit << " at the limit per address, "
               << s.closed_unauthenticated << " closed without an authorized call, "
               << s.refused_without_descriptors << " without descriptors in "
               << s.descriptor_exhaustions << " exhaustions in all; " << s.other_accept_errors
               << " other accept errors); still accepting";
  last_log_ = now;
  logged_refusals_ = refused;
}

bool GrpcListener::WaitOrStop(absl::Duration d) {
  pollfd p{wake_fd_, POLLIN, 0};
  const int ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
  return ::poll(&p, 1, ms) > 0;
}

}  // namespace asympo
