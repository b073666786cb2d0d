// GrpcListener: a TCP listening socket of the project's own whose accepted
// connections are handed to a grpc::Server, in place of
// ServerBuilder::AddListeningPort. It keeps accepting when the process runs
// out of file descriptors, and it bounds the connections open at once.
//
// Why: gRPC 1.51's POSIX TCP server (src/core/lib/iomgr/tcp_server_posix.cc,
// on_read) gives a listening socket up for good when accept4 fails with
// anything but EAGAIN or EINTR: it logs "Failed accept4" and stops polling
// it. One EMFILE (a flood of idle connections under `ulimit -n 1024`) and
// the server never accepts again, even once descriptors are free.
//
//   grpc::ServerBuilder builder;
//   ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<GrpcListener> listener,
//                           GrpcListener::Bind("127.0.0.1:0", credentials, &builder));
//   builder.RegisterService(&service);
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   listener->Start();   // after BuildAndStart
//   ...
//   listener.reset();    // before server->Shutdown()
//   server->Shutdown();
//
// gRPC's acceptor neither serves nor closes a connection handed to it before
// the server started or after it shut down (it logs "NOT handling external
// connection" and the descriptor leaks): hence Start() after BuildAndStart,
// and the listener destroyed before the server is shut down. Until Start()
// the kernel queues connections in the listen backlog.
//
// Out of descriptors (accept4 fails with EMFILE or ENFILE), the listener
// uses a descriptor it keeps in reserve (/dev/null, opened at Bind): for
// each pending connection it closes the reserve, accepts the connection
// into the freed slot and closes it at once, so that its client fails fast
// rather than hangs; it closes it with dup3 (a copy of its eventfd over the
// connection's descriptor), which keeps the slot as the reserve in the same
// step. The slot is thus free only between a close and the accept4 that
// follows, never after the last connection, where another thread opening
// descriptors would take it for good. It then waits `exhausted_backoff`
// and goes on accepting. Each such event is counted
// (stats()) and logged at most once per `log_interval`, with the counts since
// the last line, not once per connection.
//
// Bounding connections: gRPC does not tell when it closes a connection it
// was handed. The listener records, for each connection it hands over, the
// descriptor and the socket's inode (fstat); a connection counts as open
// while its descriptor still names that inode (socket inodes are not reused
// while the process runs, so a descriptor that gRPC closed and the process
// reused for anything else is told apart). The records are checked again
// (one fstat each) only when max_connections of them are held, and then at
// most every 10 ms, so the cost falls only on a listener at its limit. A connection beyond the
// limit is accepted and closed at once. The limit keeps the descriptors that checkpoints, logs and
// metrics need out of the clients' reach; the reserve descriptor handles the rest (other parts of
// the process using them up).
//
// Fair shares (common/listener/connection_table.h): connections are also limited per
// peer address, and one that has made no authorized call within
// `unauthenticated_grace` is closed (shutdown(2): gRPC then sees the
// connection end and closes its descriptor). A connection at a limit takes
// the place of the oldest one there that has not authorized; the service
// reports authorized calls through authorized_hook(), with gRPC's peer
// string, which the listener records for each connection it accepts.
//
// Thread-safety: Bind and the destructor from one thread; Start once; port(),
// bound_address(), max_connections() and stats() from any thread. The
// destructor stops accepting and joins the accept thread promptly (an
// eventfd wakes it; no polling interval); connections already handed to gRPC
// are gRPC's and stay open.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/listener/connection_table.h"

namespace asympo {

// Descriptors the default connection limit leaves to the rest of the
// process (checkpoint files, logs, the metrics endpoint, gRPC's own).
inline constexpr int kDescriptorsReservedFromConnections = 128;
// The default limit's upper bound, whatever RLIMIT_NOFILE allows.
inline constexpr int kMaxConnectionsCap = 4096;

// The soft RLIMIT_NOFILE less kDescriptorsReservedFromConnections, at most
// kMaxConnectionsCap and at least 16.
int DefaultMaxConnections();

// What the accept thread reports to GrpcListenerOptions::on_event, one call
// per event, each also counted in GrpcListenerStats.
enum class GrpcListenerEvent {
  kAccepted,                   // a connection handed to gRPC
  kRefusedAtLimit,             // closed at once: max_connections open
  kRefusedAtPeerLimit,         // closed at once: max_connections_per_peer open from its address
  kClosedUnauthenticated,      // closed: no authorized call in the grace, or evicted at a limit
  kDescriptorExhaustion,       // accept4 failed with EMFILE or ENFILE
  kRefusedWithoutDescriptors,  // closed at once through the reserve then
  kOtherAcceptError,           // another accept4 failure (ENOBUFS, ENOMEM)
};

struct GrpcListenerOptions {
  // Connections handed to gRPC and still open, at most; one more is
  // accepted and closed at once. 0: DefaultMaxConnections() at Bind.
  int max_connections = 0;
  // Connections from one peer address (IP) open at once, at most. 0: a
  // quarter of max_connections, at least 16 (never above max_connections).
  int max_connections_per_peer = 0;
  // A connection with no authorized call this long after it was accepted
  // is closed; an infinite duration: never.
  absl::Duration unauthenticated_grace = absl::InfiniteDuration();
  // After running out of descriptors, accepting pauses this long.
  absl::Duration exhausted_backoff = absl::Milliseconds(100);
  // Refused connections are logged at most once per interval.
  absl::Duration log_interval = absl::Seconds(10);
  // Called on the accept thread after each event is counted (for metrics);
  // it must not block. Unset: nothing is called.
  std::function<void(GrpcListenerEvent)> on_event;
};

struct GrpcListenerStats {
  // Connections handed to gRPC.
  int64_t accepted = 0;
  // Connections closed at once because max_connections were open.
  int64_t refused_at_limit = 0;
  int64_t refused_at_peer_limit = 0;
  // Closed for want of an authorized call: past the grace, or evicted.
  int64_t closed_unauthenticated = 0;
  // accept4 failures with EMFILE or ENFILE, and the connections closed at
  // once through the reserve descriptor then.
  int64_t descriptor_exhaustions = 0;
  int64_t refused_without_descriptors = 0;
  // Other accept4 failures (ENOBUFS, ENOMEM, ...); each pauses accepting
  // for exhausted_backoff too.
  int64_t other_accept_errors = 0;
};

class GrpcListener {
 public:
  // Binds and listens on `address`, "host:port": an IPv4 address (0.0.0.0
  // for every interface), a bracketed IPv6 address ([::1], [::]) or a name
  // such as localhost (each of its addresses, on one port); port 0 picks a
  // free port (port()). Registers an external connection acceptor with
  // `credentials` on `builder`, which must then be built before Start().
  // INVALID_ARGUMENT naming the address when it is malformed, does not
  // resolve or max_connections < 0; UNAVAILABLE naming it and the reason
  // when it cannot be bound (in use: no SO_REUSEPORT, so a second process
  // on the port fails here).
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Bind(
      const std::string& address, std::shared_ptr<grpc::ServerCredentials> credentials,
      grpc::ServerBuilder* builder, GrpcListenerOptions options = {});
  ~GrpcListener();
  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  // Starts the accept thread; call once, after builder.BuildAndStart().
  void Start();

  int port() const { return port_; }
  // "ip:port" or "[ip6]:port" of the first bound socket.
  const std::string& bound_address() const { return bound_address_; }
  int max_connections() const { return max_connections_; }
  int max_connections_per_peer() const { return table_->limits().max_per_peer; }
  // For the services' authorizer: marks the connection of a peer string
  // (ServerContext::peer()) as one that made an authorized call. Callable
  // from any thread, also after the listener is gone.
  std::function<void(const std::string& peer)> authorized_hook() const;
  GrpcListenerStats stats() const;

 private:
  GrpcListener() = default;
  void AcceptLoop();
  // Accepts what `listen_fd` has pending; false when accepting must pause.
  bool AcceptPending(int listen_fd);
  // Hands `fd` to gRPC, or closes it when max_connections are open.
  void Admit(int listen_fd, int fd, const sockaddr_storage& peer);
  // Closes the connections past the grace without an authorized call.
  void CloseExpired();
  // Shuts `c` down if its descriptor still names its socket.
  void CloseUnauthenticated(const ConnectionRef& c);
  // EMFILE/ENFILE: sheds the pending connections through the reserve.
  void ShedWithoutDescriptors(int listen_fd, int error);
  void Report(GrpcListenerEvent e) {
    if (options_.on_event) options_.on_event(e);
  }
  // Logs the refusals since the last line, at most once per log_interval.
  void MaybeLogRefusals(const std::string& why);
  // Waits `d`; true when the destructor wants the thread to stop.
  bool WaitOrStop(absl::Duration d);

  GrpcListenerOptions options_;
  int max_connections_ = 0;
  std::vector<int> listen_fds_;
  int wake_fd_ = -1;   // an eventfd: written once, by the destructor
  int spare_fd_ = -1;  // the reserve descriptor; -1 while it could not be reopened
  int port_ = 0;
  std::string bound_address_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread thread_;

  // The accept thread's own.
  std::shared_ptr<ConnectionTable> table_;
  absl::Time last_prune_ = absl::InfinitePast();
  absl::Time last_log_ = absl::InfinitePast();
  int64_t logged_refusals_ = 0;

  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> refused_at_limit_{0};
  std::atomic<int64_t> refused_at_peer_limit_{0};
  std::atomic<int64_t> closed_unauthenticated_{0};
  std::atomic<int64_t> descriptor_exhaustions_{0};
  std::atomic<int64_t> refused_without_descriptors_{0};
  std::atomic<int64_t> other_accept_errors_{0};
};

}  // namespace asympo
