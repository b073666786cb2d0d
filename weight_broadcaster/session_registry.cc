#include "weight_broadcaster/session_registry.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace asympo::broadcast::internal {
namespace {

// Of `total`, the most one caller may hold: `per_caller`, or a quarter.
int ShareOf(int total, int per_caller) {
  return std::min(total, per_caller > 0 ? per_caller : std::max(1, total / 4));
}

}  // namespace

SessionRegistry::SessionRegistry(const BroadcastSenderOptions& options)
    : options_(options), rng_(std::random_device{}()) {}

grpc::Status SessionRegistry::Find(const std::string& session_id, const std::string& principal,
                                   Session** session) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("unknown session ", QuoteForMessage(session_id),
                                     " (expired or replaced); register again"));
  }
  if (it->second.principal != principal) {
    if (options_.authorizer != nullptr) {
      options_.authorizer->CountRefusal("PERMISSION_DENIED", "session_owner");
    }
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the session belongs to another principal");
  }
  *session = &it->second;
  return grpc::Status::OK;
}

grpc::Status SessionRegistry::AdmitRegistration(const std::string& id, const std::string& principal,
                                                const std::string& share_key) {
  ExpireUnsubscribed();
  auto owner = session_of_.find(id);
  const bool replacing = owner != session_of_.end();
  if (replacing) {
    auto it = sessions_.find(owner->second);
    const bool taken = it != sessions_.end() && it->second.principal != principal &&
                       !(anonymous() && it->second.stream == nullptr && it->second.nccl_rank == 0 &&
                         options_.clock->Now() - it->second.registered >= kUnsubscribedTakeover);
    if (taken) {
      if (options_.authorizer != nullptr) {
        options_.authorizer->CountRefusal("PERMISSION_DENIED", "session_owner");
      }
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("receiver ", QuoteForMessage(id), " is registered by ",
                                       anonymous() ? "another connection" : "another principal"));
    }
  }
  const int total = options_.max_sessions;
  if (!replacing && static_cast<int>(sessions_.size()) >= total) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the learner holds ", sessions_.size(),
                                     " registrations, its limit; unsubscribed ones end after ",
                                     absl::FormatDuration(options_.unsubscribed_session_ttl)));
  }
  const int per_key = ShareOf(total, options_.max_sessions_per_principal);
  int mine = 0;
  for (const auto& [sid, s] : sessions_) {
    mine += s.share_key == share_key && s.receiver_id != id ? 1 : 0;
  }
  if (mine < per_key) return grpc::Status::OK;
  if (options_.authorizer != nullptr) {
    options_.authorizer->CountRefusal("RESOURCE_EXHAUSTED", "registrations");
  }
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat(QuoteForMessage(share_key), " holds ", mine,
                                   " registrations, its limit; unsubscribed ones end after ",
                                   absl::FormatDuration(options_.unsubscribed_session_ttl)));
}

SessionRegistry::Created SessionRegistry::Create(const std::string& id,
                                                 const std::string& principal,
                                                 const std::string& share_key) {
  Created out;
  out.session_id = absl::StrFormat("%016x%016x", rng_(), rng_());
  auto old = session_of_.find(id);
  if (old != session_of_.end()) {
    out.replaced = true;
    auto s = sessions_.find(old->second);
    if (s != sessions_.end()) {
      out.replaced_stream = s->second.stream;
      sessions_.erase(s);
    }
  }
  session_of_[id] = out.session_id;
  Session& session = sessions_[out.session_id];
  session.receiver_id = id;
  session.registered = options_.clock->Now();
  session.principal = principal;
  session.share_key = share_key;
  out.session = &session;
  return out;
}

grpc::Status SessionRegistry::AdmitFetch(const Session& session, const std::string& share_key) {
  const int total = options_.max_concurrent_fetches;
  const int per_key = ShareOf(total, options_.max_fetches_per_principal);
  const auto mine = fetches_by_key_.find(share_key);
  const int of_key = mine == fetches_by_key_.end() ? 0 : mine->second;
  if (session.fetches < options_.max_fetches_per_session && of_key < per_key && fetches_ < total) {
    return grpc::Status::OK;
  }
  if (of_key >= per_key && options_.authorizer != nullptr) {
    options_.authorizer->CountRefusal("RESOURCE_EXHAUSTED", "fetches");
  }
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat(session.fetches, " fetches of this session, ", of_key, " of ",
                   QuoteForMessage(share_key), " and ", fetches_, " in all are under way (limits ",
                   options_.max_fetches_per_session, ", ", per_key, " and ", total,
                   "); finish or cancel one first"));
}

void SessionRegistry::FetchStarted(const std::string& session_id, Session& session,
                                   const std::string& share_key) {
  ++session.fetches;
  ++fetches_;
  ++fetches_by_key_[share_key];
  Fetching& f = fetching_[session_id];
  f.share_key = share_key;
  ++f.count;
}

void SessionRegistry::FetchDone(const std::string& session_id) {
  --fetches_;
  if (auto f = fetching_.find(session_id); f != fetching_.end()) {
    auto k = fetches_by_key_.find(f->second.share_key);
    if (k != fetches_by_key_.end() && --k->second <= 0) fetches_by_key_.erase(k);
    if (--f->second.count <= 0) fetching_.erase(f);
  }
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) --it->second.fetches;
}

bool SessionRegistry::EndWithStream(const std::string& session_id, const SubscribeReactor* stream) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.stream != stream) return false;
  auto r = session_of_.find(it->second.receiver_id);
  if (r != session_of_.end() && r->second == session_id) session_of_.erase(r);
  sessions_.erase(it);
  return true;
}

void SessionRegistry::ExpireUnsubscribed() {
  const absl::Time cutoff = options_.clock->Now() - options_.unsubscribed_session_ttl;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const Session& s = it->second;
    if (s.stream != nullptr || s.nccl_rank > 0 || s.registered > cutoff) {
      ++it;
      continue;
    }
    auto owner = session_of_.find(s.receiver_id);
    if (owner != session_of_.end() && owner->second == it->first) session_of_.erase(owner);
    sessions_.erase(it++);
  }
}

int SessionRegistry::subscribed() const {
  int n = 0;
  for (const auto& [id, s] : sessions_) n += s.stream != nullptr ? 1 : 0;
  return n;
}

std::vector<uint64_t> SessionRegistry::versions_in_use() const {
  std::set<uint64_t> versions;
  for (const auto& [id, s] : sessions_) {
    if (s.stream != nullptr) versions.insert(s.version);
  }
  return {versions.begin(), versions.end()};
}

}  // namespace asympo::broadcast::internal
