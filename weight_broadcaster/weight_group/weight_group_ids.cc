#include "weight_broadcaster/weight_group/weight_group_ids.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace asympo::broadcast {

void WorkerIds::Release(absl::Time now, const std::function<bool(const std::string&)>& in_use) {
  for (auto it = ids_.begin(); it != ids_.end();) {
    const auto b = id_backoff_.find(it->first);
    const bool kept_out = b != id_backoff_.end() && b->second.until > now;
    if (kept_out || now - it->second.last_used < options_.worker_id_ttl || in_use(it->first)) {
      ++it;
      continue;
    }
    auto o = ids_of_owner_.find(it->second.owner);
    if (o != ids_of_owner_.end() && --o->second <= 0) ids_of_owner_.erase(o);
    if (b != id_backoff_.end()) id_backoff_.erase(b);
    ids_.erase(it++);
  }
  for (auto it = owner_backoff_.begin(); it != owner_backoff_.end();) {
    // An owner's record outlives its back-off by the longest back-off, so
    // that failures in a row keep doubling it.
    if (it->second.until + options_.max_rendezvous_backoff < now) {
      owner_backoff_.erase(it++);
    } else {
      ++it;
    }
  }
}

grpc::Status WorkerIds::Admit(const std::string& id, const std::string& owner, bool rejoining,
                              absl::Time now, const std::function<bool(const std::string&)>& in_use,
                              absl::Duration* retry_after, std::string* cause) {
  Release(now, in_use);
  auto it = ids_.find(id);
  if (it != ids_.end() && it->second.owner != owner) {
    *cause = "worker_owner";
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("worker_id ", QuoteForMessage(id),
                                     " is bound to another principal; choose another id"));
  }
  const auto kept = [&](const Backoff* b, const std::string& whom) -> grpc::Status {
    *retry_after = b->until - now;
    *cause = "rendezvous_backoff";
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(whom, " failed a rendezvous of the weight group and is kept out for ",
                     absl::ToInt64Milliseconds(*retry_after), " ms more"));
  };
  if (auto b = id_backoff_.find(id); b != id_backoff_.end() && b->second.until > now) {
    return kept(&b->second, absl::StrCat("worker ", QuoteForMessage(id)));
  }
  if (!rejoining) {
    if (auto b = owner_backoff_.find(owner); b != owner_backoff_.end() && b->second.until > now) {
      return kept(&b->second, absl::StrCat(QuoteForMessage(owner), ", which brings new worker ",
                                           QuoteForMessage(id), ","));
    }
  }
  if (it == ids_.end()) {
    int& mine = ids_of_owner_[owner];
    if (mine >= options_.max_worker_ids_per_principal) {
      *cause = "worker_ids";
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(QuoteForMessage(owner), " holds ", mine,
                       " worker ids of the weight group, its limit; an id is released ",
                       absl::FormatDuration(options_.worker_id_ttl), " after it left the group"));
    }
    ++mine;
    it = ids_.emplace(id, Id{owner, now}).first;
  }
  it->second.last_used = now;
  return grpc::Status::OK;
}

void WorkerIds::Touch(const std::string& id, absl::Time now) {
  if (auto it = ids_.find(id); it != ids_.end()) it->second.last_used = now;
}

absl::Duration WorkerIds::KeepOut(const std::string& id, absl::Time now) {
  const auto step = [&](Backoff& b) {
    b.failures = std::min(b.failures + 1, 30);
    absl::Duration d = options_.rendezvous_backoff;
    for (int i = 1; i < b.failures && d < options_.max_rendezvous_backoff; ++i) d *= 2;
    d = std::min(d, options_.max_rendezvous_backoff);
    b.until = now + d;
    return d;
  };
  const absl::Duration d = step(id_backoff_[id]);
  if (auto it = ids_.find(id); it != ids_.end()) {
    it->second.last_used = now;
    step(owner_backoff_[it->second.owner]);
  }
  return d;
}

void WorkerIds::Cleared(const std::string& id) {
  id_backoff_.erase(id);
  if (auto it = ids_.find(id); it != ids_.end()) owner_backoff_.erase(it->second.owner);
}

}  // namespace asympo::broadcast
