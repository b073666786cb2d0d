// The sender's receiver sessions (broadcast_sender.h, "Sessions" and
// "Security"): who registered each, which receiver id it holds, the
// registrations and fetches under way against their limits (in all and per
// caller), and the expiry of registrations that never subscribed. The
// transports (the gRPC streams, the NCCL ranks) hang their state off a
// session; the registry decides only ownership, room and expiry.
//
// Not thread-safe by itself: the sender's mutex guards it (SenderState::mu).
// Internal to weight_broadcaster/.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace asympo::broadcast::internal {

class SubscribeReactor;

// Where callers are anonymous, how long a registration must stay
// unsubscribed before another connection may take its receiver id over (its
// own connection may have gone; a receiver subscribes within milliseconds).
inline constexpr absl::Duration kUnsubscribedTakeover = absl::Seconds(5);

class SessionRegistry {
 public:
  // One registration. A session ends when its Subscribe stream ends or when
  // its receiver registers again.
  struct Session {
    std::string receiver_id;
    uint64_t version = 0;  // what the receiver samples with, as last reported
    SubscribeReactor* stream = nullptr;
    int nccl_rank = 0;      // > 0: the session's receiver is this NCCL rank
    absl::Time registered;  // options.clock's time at Register
    int fetches = 0;        // under way
    std::string principal;  // who registered it; only they may use it
    std::string share_key;  // security::ShareKey of who registered it
    absl::Time failure_counted = absl::InfinitePast();  // its last failure report counted
  };

  // The limits, clock and authorizer (for counting refusals) of `options`,
  // which must outlive the registry.
  explicit SessionRegistry(const BroadcastSenderOptions& options);

  // Whether callers are anonymous (owners are connections).
  bool anonymous() const {
    return options_.authorizer == nullptr || !options_.authorizer->authenticates();
  }

  // The session `session_id` if it exists and belongs to `principal`:
  // FAILED_PRECONDITION for an unknown one, PERMISSION_DENIED for another
  // principal's (counted).
  grpc::Status Find(const std::string& session_id, const std::string& principal, Session** session);

  // OK when `principal` may register receiver `id` now: the id is not
  // another owner's (PERMISSION_DENIED, counted; where callers are
  // anonymous, an owner is a connection, which may have gone: its session
  // may be taken over once it has stayed unsubscribed for
  // kUnsubscribedTakeover), and the registration fits within max_sessions
  // in all (unless it replaces its own) and within the per-principal share
  // of `share_key` (RESOURCE_EXHAUSTED, counted). Registrations that never
  // subscribed within unsubscribed_session_ttl are ended first.
  grpc::Status AdmitRegistration(const std::string& id, const std::string& principal,
                                 const std::string& share_key);

  // A new session for receiver `id` (a fresh random id), owned by
  // `principal`. The receiver's previous session, if any, ends; its stream
  // (null when it had none) is handed back for the caller to end.
  struct Created {
    std::string session_id;
    Session* session = nullptr;
    bool replaced = false;  // the receiver had a session
    SubscribeReactor* replaced_stream = nullptr;
  };
  Created Create(const std::string& id, const std::string& principal, const std::string& share_key);

  // OK when `session` may start one more fetch (max_fetches_per_session,
  // the caller's share of max_concurrent_fetches, max_concurrent_fetches);
  // else RESOURCE_EXHAUSTED naming the three counts. FetchStarted counts
  // one; FetchDone, when it ends (the session may have ended meanwhile).
  grpc::Status AdmitFetch(const Session& session, const std::string& share_key);
  void FetchStarted(const std::string& session_id, Session& session, const std::string& share_key);
  void FetchDone(const std::string& session_id);

  // Ends session `session_id` if its stream is `stream` (its Subscribe
  // stream ended); false when it is gone or has another stream.
  bool EndWithStream(const std::string& session_id, const SubscribeReactor* stream);

  // Every session, by session id (the transports walk them: for (auto&
  // [session_id, session] : registry)).
  auto begin() { return sessions_.begin(); }
  auto end() { return sessions_.end(); }
  auto begin() const { return sessions_.begin(); }
  auto end() const { return sessions_.end(); }
  // Receivers with an open Subscribe stream, and the distinct versions they
  // sample with (sorted).
  int subscribed() const;
  std::vector<uint64_t> versions_in_use() const;

 private:
  void ExpireUnsubscribed();

  const BroadcastSenderOptions& options_;
  absl::flat_hash_map<std::string, Session> sessions_;        // by session id
  absl::flat_hash_map<std::string, std::string> session_of_;  // receiver -> session
  std::mt19937_64 rng_;
  int fetches_ = 0;  // under way, all sessions
  // Fetches under way by share key, and each fetching session's key and
  // count (a session may end before its fetches do).
  absl::flat_hash_map<std::string, int> fetches_by_key_;
  struct Fetching {
    std::string share_key;
    int count = 0;
  };
  absl::flat_hash_map<std::string, Fetching> fetching_;  // by session id
};

}  // namespace asympo::broadcast::internal
