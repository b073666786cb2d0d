// The weight group's worker ids (weight_group.h, "Security"): each id is
// bound to the principal that joined it first (a peer host where callers
// are anonymous) until it has been out of the group for worker_id_ttl; a
// principal holds at most max_worker_ids_per_principal of them; and a
// worker blamed for a failed rendezvous is kept out for a while, its
// principal bringing no new id meanwhile.
//
// Not thread-safe: the group's mutex guards it. Internal to the weight
// group.
#pragma once

#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "weight_broadcaster/weight_group/weight_group.h"

namespace asympo::broadcast {

class WorkerIds {
 public:
  // The limits of `options`, which must outlive it.
  explicit WorkerIds(const WeightGroupOptions& options) : options_(options) {}

  // OK when `owner` may join as worker `id` at `now`, and the id is then
  // bound to it. PERMISSION_DENIED (cause "worker_owner") for another
  // owner's id; RESOURCE_EXHAUSTED for an id kept out, for a new id of an
  // owner kept out unless `rejoining` (the id is a member of the current
  // or the last generation; cause "rendezvous_backoff", `*retry_after` the
  // time left), or for a new id beyond the owner's limit (cause
  // "worker_ids"). `*cause` names the refusal for the metrics. Ids for
  // which `in_use` is false and that were last used worker_id_ttl ago are
  // released first.
  grpc::Status Admit(const std::string& id, const std::string& owner, bool rejoining,
                     absl::Time now, const std::function<bool(const std::string&)>& in_use,
                     absl::Duration* retry_after, std::string* cause);
  // The id took part in the group at `now` (keeps its binding).
  void Touch(const std::string& id, absl::Time now);
  // The worker failed a rendezvous at `now`: it, and its owner's new ids,
  // are kept out (the back-off doubles with each failure in a row). Returns
  // for how long.
  absl::Duration KeepOut(const std::string& id, absl::Time now);
  // The worker completed a rendezvous: its back-off, and its owner's,
  // start again from the first step.
  void Cleared(const std::string& id);
  // Ids bound now (tests and the log).
  int bound() const { return static_cast<int>(ids_.size()); }

 private:
  struct Id {
    std::string owner;
    absl::Time last_used;
  };
  struct Backoff {
    absl::Time until = absl::InfinitePast();
    int failures = 0;
  };
  void Release(absl::Time now, const std::function<bool(const std::string&)>& in_use);

  const WeightGroupOptions& options_;
  absl::flat_hash_map<std::string, Id> ids_;                 // by worker id
  absl::flat_hash_map<std::string, int> ids_of_owner_;       // how many each owner holds
  absl::flat_hash_map<std::string, Backoff> id_backoff_;     // by worker id
  absl::flat_hash_map<std::string, Backoff> owner_backoff_;  // by owner
};

}  // namespace asympo::broadcast
