// The state of the weight group (weight_group.h), shared by its calls
// (weight_group.cc), their answering thread (weight_group_waiting.cc) and
// the group thread (weight_group_loop.cc). Internal: only those files
// include it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include <grpcpp/grpcpp.h>

#include <ATen/ATen.h>
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/collective/collective_group.h"
#include "weight_broadcaster/weight_group/weight_group.h"
#include "weight_broadcaster/weight_group/weight_group_ids.h"
#include "weight_broadcaster/weight_group/weight_group_store.h"

namespace asympo::broadcast {

// A Join that a newer Join under the same worker id replaced is ABORTED
// with this trailing metadata, so that clients can tell it from other
// ABORTED answers (docs/protocol.md, "Weight group").
inline constexpr char kAbortReasonMetadataKey[] = "asympo-abort-reason";
inline constexpr char kJoinReplaced[] = "join_replaced";

// Every call that finds the group stopping gets the same answer; clients
// treat UNAVAILABLE as "try again elsewhere or later".
inline grpc::Status GroupShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the learner is shutting down");
}

struct WeightGroup::State {
  WeightGroupOptions options;
  WorkerIds ids{options};  // guarded by mu

  // Metrics.
  prometheus::Gauge* members_gauge = nullptr;
  prometheus::Gauge* generation_gauge = nullptr;
  prometheus::Counter* versions_total = nullptr;
  prometheus::Counter* delta_versions_total = nullptr;
  prometheus::Counter* bytes_total = nullptr;
  prometheus::Family<prometheus::Counter>* failures = nullptr;

  // A worker waiting in Join, and what the formation assigns it.
  struct Joiner {
    std::string worker_id;
    std::string owner;  // its principal's share key
    uint64_t seq = 0;   // join order
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
    bool accepts_delta = false;  // GroupNextRequest.accepts_delta, of its last Next
    bool asking = false;         // a Next call is waiting for an answer
    bool told = false;           // its waiting Next has been answered
    v1::GroupNextResponse::Action action = v1::GroupNextResponse::ACTION_WAIT;
    std::shared_ptr<const v1::GroupNextResponse> receive;  // with ACTION_RECEIVE
    absl::Time asked_since = absl::InfinitePast();
    absl::Time last_seen;
    int calls = 0;      // calls in flight naming this member
    int store_ops = 0;  // Store calls it made in its generation
  };
  // A trial (weight_group_trial.cc): while a generation with members runs,
  // newcomers first rendezvous with rank 0 alone, over a store of their
  // own; only those that complete it are taken into the next generation,
  // which then replaces the current one at its next boundary.
  struct Trial {
    uint64_t generation = 0;
    std::vector<Member> members;
    std::shared_ptr<GenerationStore> store;
  };
  enum class Phase { kNone, kForming, kConnecting, kActive, kBroadcasting };

  // A call parked until the group can answer it (weight_group_waiting.cc).
  struct Waiting {
    enum class Kind { kJoin, kNext, kStore };
    Kind kind = Kind::kJoin;
    grpc::CallbackServerContext* ctx = nullptr;
    grpc::ServerUnaryReactor* reactor = nullptr;
    grpc::ByteBuffer* reply = nullptr;
    absl::Time deadline;
    std::string caller;                           // its share key (security::ShareKey)
    std::shared_ptr<Joiner> joiner;               // kJoin
    std::string token;                            // kNext, kStore: the member's token
    v1::GroupStoreRequest request;                // kStore: a GET or WAIT
    c10::intrusive_ptr<c10d::Store> group_store;  // kStore: the store it waits on

    // The call this waits for: `ctx`'s reactor and reply, for `wait`.
    void Bind(Kind k, grpc::CallbackServerContext* call, grpc::ByteBuffer* out,
              absl::Duration wait) {
      kind = k;
      ctx = call;
      reply = out;
      deadline = absl::Now() + wait;
    }
  };

  mutable absl::Mutex mu;
  absl::CondVar cv;  // any change below
  bool shut_down = false;
  Phase phase = Phase::kNone;
  uint64_t generation = 0;
  uint64_t last_generation = 0;  // the last number given, to a generation or a trial
  bool regroup = false;          // end the current generation at the next boundary
  std::string regroup_reason;
  uint64_t join_seq = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<Joiner>> joiners;  // by worker id
  std::vector<Member> members;                                        // rank order
  std::shared_ptr<GenerationStore> store;                             // the generation's
  // Newcomers: of the current generation, those that came in from a trial
  // (blamed first when its rendezvous fails); waiting to come in, those
  // whose trial succeeded. Rejoining: the last generation's worker ids
  // while the next one forms.
  absl::flat_hash_set<std::string> newcomers;
  absl::flat_hash_set<std::string> proven;
  absl::flat_hash_set<std::string> rejoining;
  std::unique_ptr<Trial> trial;  // the one under way, if any
  std::thread trial_thread;
  c10::intrusive_ptr<collective::CollectiveGroup> pg;
  SnapshotStore* snapshots = nullptr;  // its reader signals cv on every publish
  int reader_id = -1;
  int64_t versions_sent = 0;
  at::Tensor device_buffer;  // NCCL: the largest bucket's size, on the GPU
  std::thread thread;
  // Parked calls, and how many each caller has parked.
  std::vector<std::unique_ptr<Waiting>> waiting;
  absl::flat_hash_map<std::string, int> waiting_by_caller;
  absl::flat_hash_map<std::string, int> waiting_by_member;  // by member token
  std::thread answerer;

  // Parks `w` (its reactor is finished later by the answering thread;
  // *parked true), or refuses it with RESOURCE_EXHAUSTED when max_waiting
  // or the caller's max_waiting_per_caller calls wait already (its reactor
  // finished at once; *parked false). Returns the call's reactor.
  grpc::ServerUnaryReactor* ParkLocked(std::unique_ptr<Waiting> w, bool* parked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The answering thread: finishes each parked call once it is settled.
  void Answer();
  // Whether `w` can be answered now, and its answer (written to w.reply).
  bool SettledLocked(const Waiting& w, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  grpc::Status AnswerLocked(Waiting& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  grpc::Status AnswerJoinLocked(Waiting& w, v1::JoinGroupResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  grpc::Status AnswerNextLocked(Waiting& w, v1::GroupNextResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The member of the current generation or of the trial that `token`
  // names (null: none), and the store of its generation.
  Member* MemberOf(const std::string& token, std::shared_ptr<GenerationStore>* its_store = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (phase != Phase::kNone && phase != Phase::kForming) {
      for (Member& m : members) {
        if (m.token != token) continue;
        if (its_store != nullptr) *its_store = store;
        return &m;
      }
    }
    if (trial != nullptr) {
      for (Member& m : trial->members) {
        if (m.token != token) continue;
        if (its_store != nullptr) *its_store = trial->store;
        return &m;
      }
    }
    return nullptr;
  }
  // Whether worker `id` is joining, a member or in the trial (its binding
  // is kept).
  bool InUseLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Refusals: counted with `cause` when there is an authorizer.
  void CountRefusal(const grpc::Status& status, const std::string& cause) {
    if (options.authorizer != nullptr && !cause.empty()) {
      options.authorizer->CountRefusal(status.error_code() == grpc::StatusCode::PERMISSION_DENIED
                                           ? "PERMISSION_DENIED"
                                           : "RESOURCE_EXHAUSTED",
                                       cause);
    }
  }
  // After a failed rendezvous of `failed` (a generation's or a trial's
  // members): keeps out those that made no Store call, or when all did,
  // those of them in `suspects` (the newcomers). Returns their ids.
  std::vector<std::string> BlameLocked(const std::vector<Member>& failed,
                                       const absl::flat_hash_set<std::string>& suspects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // OK when `owner` may join as worker `id` now (WorkerIds::Admit); a
  // refusal is counted, with a retry hint on `ctx` for a back-off.
  grpc::Status AdmitJoinLocked(const std::string& id, const std::string& owner,
                               grpc::CallbackServerContext* ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Starts a trial of the joiners not yet proven (trial_thread).
  void StartTrialLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RunTrial();
  // Gives a member of a generation numbered `gen` its rank, token and
  // the answer of its waiting Join; the joiner leaves `joiners`.
  Member AdmitLocked(Joiner& j, uint64_t gen, int rank, int world, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Fail(const std::string& reason) { failures->Add({{"reason", reason}}).Increment(); }

  // Ends the current generation at the next boundary.
  void RegroupLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!regroup) {
      regroup = true;
      regroup_reason = why;
    }
    cv.SignalAll();
  }

  // Whether a member lacks `latest` (the store's latest snapshot).
  static bool Lacks(const Member& m, const Snapshot* latest) {
    return latest != nullptr && (m.held_version != latest->version() ||
                                 m.held_incarnation != latest->manifest().incarnation());
  }

  // Rank 0's process group of a world of `world` ranks over `s` (blocks
  // until the rendezvous completes; throws c10d's errors).
  c10::intrusive_ptr<collective::CollectiveGroup> NewRankZero(
      const c10::intrusive_ptr<c10d::Store>& s, int world) const {
    return options.backend == "nccl"
               ? collective::NewNcclGroup(s, 0, world, Millis(options.timeout))
               : collective::NewGlooGroup(s, 0, world, Millis(options.timeout), options.address);
  }

  void Loop();
  // Ends the current generation and gathers the Joins of the next one
  // (sorted by join order; empty on shutdown or when nobody joined).
  std::vector<std::shared_ptr<Joiner>> EndAndGatherLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes `joined` the members of the current generation, ranks 1..N.
  void AssignLocked(const std::vector<std::shared_ptr<Joiner>>& joined)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Form();
  // Broadcasts the latest snapshot (its delta when DeltaFitsLocked).
  void Broadcast();
  // One collective broadcast of `size` bytes at `data` from rank 0. NCCL:
  // from `on_device` (the same bytes on the group's GPU) when given, else
  // through device_buffer.
  void BroadcastBytes(collective::CollectiveGroup& group, const char* data, const void* on_device,
                      int64_t size);
  // Whether the broadcast of `latest` can be its delta: it has one, and
  // every member holds its base, of the same incarnation, and accepts deltas.
  bool DeltaFitsLocked(const Snapshot& latest) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const v1::SnapshotManifest& m = latest.manifest();
    if (latest.delta == nullptr || !m.has_delta_base() || members.empty()) return false;
    for (const Member& x : members) {
      if (!x.accepts_delta || x.held_version != m.delta_base_version() ||
          x.held_incarnation != m.incarnation()) {
        return false;
      }
    }
    return true;
  }
  // Answers every member's waiting Next with `action` (and, with
  // ACTION_RECEIVE, `receive`: the manifest and whether it comes as a delta).
  void TellAllLocked(v1::GroupNextResponse::Action action,
                     std::shared_ptr<const v1::GroupNextResponse> receive = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Member& m : members) {
      m.action = action;
      m.receive = receive;
      m.told = true;
    }
    cv.SignalAll();
  }
};

}  // namespace asympo::broadcast
