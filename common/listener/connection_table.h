// ConnectionTable: the connections a GrpcListener handed to gRPC, by peer,
// with the rules that keep one peer, or peers that never authenticate,
// from taking every connection slot:
// - at most `max_connections` open in all and `max_per_peer` from one peer
//   address (the IP, without the port);
// - a connection whose peer has made no authorized call (MarkAuthorized)
//   within `grace` of being accepted is closed (Expired), unless it is
//   still receiving its first request (a large message on a slow or busy
//   link is authorized only once it has arrived whole): one that received
//   at least `min_progress_bytes` in the last grace gets another;
// - a connection that finds its peer's share or the whole table full
//   takes the place of the oldest connection there that has not
//   authorized (closed), and is refused only where every one has.
// So an outsider holding connections that never authenticate cannot lock
// out a client with credentials: its new connection evicts one of the
// outsider's and authorizes within milliseconds.
//
// The table does no I/O: the listener closes what Admit evicts and what
// Expired returns (after checking the descriptor still names the socket).
// A record is keyed by descriptor; a descriptor admitted again replaces
// its stale record (gRPC closed the old connection and the number was
// reused). Thread-safe: the listener's thread admits and expires, gRPC's
// threads mark.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asympo {

struct ConnectionLimits {
  int max_connections = 4096;
  int max_per_peer = 1024;
  // Without an authorized call for this long, a connection is closed;
  // an infinite duration: never.
  absl::Duration grace = absl::InfiniteDuration();
  // Received in one grace, a connection is still being sent a request.
  uint64_t min_progress_bytes = 64 << 10;
};

// A connection to close: its descriptor and the socket inode it had.
struct ConnectionRef {
  int fd = -1;
  uint64_t inode = 0;
};

class ConnectionTable {
 public:
  explicit ConnectionTable(ConnectionLimits limits) : limits_(limits) {}

  enum class Verdict { kAdmitted, kRefusedAtLimit, kRefusedAtPeerLimit };
  struct Admission {
    Verdict verdict = Verdict::kAdmitted;
    std::vector<ConnectionRef> evicted;  // to close: places taken by this one
  };
  // A new connection `fd` (socket `inode`) from `peer`, gRPC's peer string
  // ("ipv4:10.0.0.7:40312", "ipv6:[::1]:40312"), whose address is
  // `address` ("10.0.0.7"). Admitted connections are recorded.
  Admission Admit(int fd, uint64_t inode, const std::string& peer, const std::string& address,
                  absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The connection of `peer` has made an authorized call: it is never
  // evicted or expired. Unknown peers are ignored.
  void MarkAuthorized(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);
  // Connections past the grace without an authorized call, forgotten.
  // With `received` (the bytes a descriptor's socket has received, read
  // under the table's lock), one that received at least min_progress_bytes
  // since it was accepted or last renewed is renewed instead: its grace
  // starts again at `now`.
  std::vector<ConnectionRef> Expired(absl::Time now,
                                     const std::function<uint64_t(int fd)>& received = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the connections for which `open(fd, inode)` is false (gRPC
  // closed them).
  template <typename Open>
  void Prune(Open open) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<int> gone;
    for (const auto& [fd, c] : by_fd_) {
      if (!open(fd, c.inode)) gone.push_back(fd);
    }
    for (const int fd : gone) RemoveLocked(fd);
  }

  int open() const ABSL_LOCKS_EXCLUDED(mu_);
  int open_from(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);
  const ConnectionLimits& limits() const { return limits_; }

 private:
  using Order = std::set<std::pair<uint64_t, int>>;  // (admission number, fd)
  struct Connection {
    uint64_t inode = 0;
    uint64_t seq = 0;
    std::string peer;
    std::string address;
    absl::Time accepted;    // or last renewed
    uint64_t received = 0;  // bytes the socket had received then
    bool authorized = false;
  };
  struct Peer {
    int open = 0;
    Order unauthorized;
  };
  void RemoveLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `fd` a new grace from `now`: the newest of the unauthorized.
  void RenewLocked(int fd, absl::Time now, uint64_t received) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the oldest connection of `order` into `out`; false if empty.
  bool EvictOldestLocked(const Order& order, std::vector<ConnectionRef>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ConnectionLimits limits_;
  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int, Connection> by_fd_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> by_peer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Peer> by_address_ ABSL_GUARDED_BY(mu_);
  Order unauthorized_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo
