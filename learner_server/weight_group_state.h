// The state of the weight group (weight_group.h), shared by its calls
// (weight_group.cc) and its thread (weight_group_loop.cc). Internal: only
// those two files include it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include <ATen/ATen.h>
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/collective/collective_group.h"
#include "learner_server/weight_group.h"

namespace asympo::learner {

struct WeightGroup::State {
  WeightGroupOptions options;

  // Metrics.
  prometheus::Gauge* members_gauge = nullptr;
  prometheus::Gauge* generation_gauge = nullptr;
  prometheus::Counter* versions_total = nullptr;
  prometheus::Family<prometheus::Counter>* failures = nullptr;

  // A worker waiting in Join, and what the formation assigns it.
  struct Joiner {
    std::string worker_id;
    uint64_t seq = 0;  // join order
    bool formed = false;
    bool replaced = false;  // a newer Join under the same id took its place
    uint64_t generation = 0;
    int rank = 0;
    int world_size = 0;
    std::string token;
  };
  // A member of the current generation.
  struct Member {
    std::string worker_id;
    std::string token;
    int rank = 0;
    uint64_t held_version = 0;
    std::string held_incarnation;
    bool asking = false;  // a Next call is waiting for an answer
    bool told = false;    // its waiting Next has been answered
    v1::GroupNextResponse::Action action = v1::GroupNextResponse::ACTION_WAIT;
    std::shared_ptr<const v1::SnapshotManifest> manifest;  // with ACTION_RECEIVE
    absl::Time asked_since = absl::InfinitePast();
    absl::Time last_seen;
    int calls = 0;  // calls in flight naming this member
  };
  enum class Phase { kNone, kForming, kConnecting, kActive, kBroadcasting };

  mutable absl::Mutex mu;
  absl::CondVar cv;  // any change below
  bool shut_down = false;
  Phase phase = Phase::kNone;
  uint64_t generation = 0;
  bool regroup = false;  // end the current generation at the next boundary
  std::string regroup_reason;
  uint64_t join_seq = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<Joiner>> joiners;  // by worker id
  std::vector<Member> members;                                        // rank order
  c10::intrusive_ptr<c10d::Store> store;                              // the generation's
  c10::intrusive_ptr<collective::CollectiveGroup> pg;
  std::shared_ptr<const v1::SnapshotManifest> latest;
  broadcast::HostBuckets latest_host;
  int64_t versions_sent = 0;
  at::Tensor device_buffer;  // NCCL: the largest bucket's size, on the GPU
  std::thread thread;

  Member* MemberOf(const std::string& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (phase == Phase::kNone || phase == Phase::kForming) return nullptr;
    for (Member& m : members) {
      if (m.token == token) return &m;
    }
    return nullptr;
  }

  void Fail(const std::string& reason) { failures->Add({{"reason", reason}}).Increment(); }

  // Ends the current generation at the next boundary.
  void RegroupLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!regroup) {
      regroup = true;
      regroup_reason = why;
    }
    cv.SignalAll();
  }

  // Whether a member lacks the latest snapshot.
  bool Lacks(const Member& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return latest != nullptr &&
           (m.held_version != latest->version() || m.held_incarnation != latest->incarnation());
  }

  void Loop();
  // Ends the current generation and gathers the Joins of the next one
  // (sorted by join order; empty on shutdown or when nobody joined).
  std::vector<std::shared_ptr<Joiner>> EndAndGatherLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes `joined` the members of the current generation, ranks 1..N.
  void AssignLocked(const std::vector<std::shared_ptr<Joiner>>& joined)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Form();
  void Broadcast();
  // Answers every member's waiting Next with `action` (and `manifest`).
  void TellAllLocked(v1::GroupNextResponse::Action action,
                     std::shared_ptr<const v1::SnapshotManifest> manifest = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Member& m : members) {
      m.action = action;
      m.manifest = manifest;
      m.told = true;
    }
    cv.SignalAll();
  }
};

}  // namespace asympo::learner
