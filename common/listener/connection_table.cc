#include "common/listener/connection_table.h"

namespace asympo {

ConnectionTable::Admission ConnectionTable::Admit(int fd, uint64_t inode, const std::string& peer,
                                                  const std::string& address, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (by_fd_.contains(fd)) RemoveLocked(fd);  // the number was reused: the old one is gone
  Admission a;
  // A share as large as the whole is the whole: refused at the limit below.
  auto at = by_address_.find(address);
  if (limits_.max_per_peer < limits_.max_connections && at != by_address_.end() &&
      at->second.open >= limits_.max_per_peer &&
      !EvictOldestLocked(at->second.unauthorized, &a.evicted)) {
    a.verdict = Verdict::kRefusedAtPeerLimit;
    return a;
  }
  if (static_cast<int>(by_fd_.size()) >= limits_.max_connections &&
      !EvictOldestLocked(unauthorized_, &a.evicted)) {
    a.verdict = Verdict::kRefusedAtLimit;
    return a;
  }
  Connection& c = by_fd_[fd];
  c.inode = inode;
  c.seq = next_seq_++;
  c.peer = peer;
  c.address = address;
  c.accepted = now;
  by_peer_[peer] = fd;
  Peer& p = by_address_[address];
  ++p.open;
  p.unauthorized.insert({c.seq, fd});
  unauthorized_.insert({c.seq, fd});
  return a;
}

void ConnectionTable::MarkAuthorized(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = by_peer_.find(peer);
  if (it == by_peer_.end()) return;
  Connection& c = by_fd_[it->second];
  if (c.authorized) return;
  c.authorized = true;
  unauthorized_.erase({c.seq, it->second});
  by_address_[c.address].unauthorized.erase({c.seq, it->second});
}

std::vector<ConnectionRef> ConnectionTable::Expired(
    absl::Time now, const std::function<uint64_t(int fd)>& received) {
  std::vector<ConnectionRef> out;
  absl::MutexLock lock(&mu_);
  while (!unauthorized_.empty()) {
    const int fd = unauthorized_.begin()->second;
    const Connection& c = by_fd_[fd];
    if (now - c.accepted < limits_.grace) break;  // the rest are younger
    if (received != nullptr) {
      const uint64_t bytes = received(fd);
      if (bytes >= c.received + limits_.min_progress_bytes) {
        RenewLocked(fd, now, bytes);  // still receiving its first request
        continue;
      }
    }
    out.push_back({fd, c.inode});
    RemoveLocked(fd);
  }
  return out;
}

void ConnectionTable::RenewLocked(int fd, absl::Time now, uint64_t received) {
  Connection& c = by_fd_[fd];
  Peer& p = by_address_[c.address];
  p.unauthorized.erase({c.seq, fd});
  unauthorized_.erase({c.seq, fd});
  c.seq = next_seq_++;
  c.accepted = now;
  c.received = received;
  p.unauthorized.insert({c.seq, fd});
  unauthorized_.insert({c.seq, fd});
}

int ConnectionTable::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(by_fd_.size());
}

int ConnectionTable::open_from(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = by_address_.find(address);
  return it == by_address_.end() ? 0 : it->second.open;
}

void ConnectionTable::RemoveLocked(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  const Connection& c = it->second;
  auto peer = by_peer_.find(c.peer);
  if (peer != by_peer_.end() && peer->second == fd) by_peer_.erase(peer);
  auto at = by_address_.find(c.address);
  if (at != by_address_.end()) {
    at->second.unauthorized.erase({c.seq, fd});
    if (--at->second.open <= 0) by_address_.erase(at);
  }
  unauthorized_.erase({c.seq, fd});
  by_fd_.erase(it);
}

bool ConnectionTable::EvictOldestLocked(const Order& order, std::vector<ConnectionRef>* out) {
  if (order.empty()) return false;
  const int fd = order.begin()->second;
  out->push_back({fd, by_fd_[fd].inode});
  RemoveLocked(fd);  // `order` may be the peer's set, which this can erase: read it first
  return true;
}

}  // namespace asympo
