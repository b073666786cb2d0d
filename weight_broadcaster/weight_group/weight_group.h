// The weight group: a collective group (c10d Gloo or NCCL) for weight
// updates that external engine workers join, served on the learner's gRPC
// port (proto/asympo/v1/weight_group.proto; docs/protocol.md, "Weight
// group").
//
// The learner is rank 0 of every generation. Workers Join; the group thread
// forms a generation from the workers that joined within the join window
// (ranks 1..N in the order they joined), keeps its c10d store (a HashStore
// the members reach through the Store call) and builds rank 0's process
// group over it while the members build theirs. Then, whenever every member
// has asked for a version (Next) and at least one of them lacks the latest
// published snapshot, all of them get its manifest and the thread
// broadcasts its buckets from the snapshot's host memory, one broadcast per
// bucket. NCCL: from the learner's staged copy on its GPU when the snapshot
// has one (Snapshot::device_bucket: a learner on a GPU with
// --snapshot_staging=device), with no copy to the host and back; else
// through one device buffer of the largest bucket's size.
// When the latest snapshot has a delta (SnapshotStoreOptions::
// delta_keyframe_every) and every member holds its base version, of the
// same incarnation, and asked with accepts_delta, the broadcasts carry the
// delta's buckets instead (the whole bucket where the delta has none), and
// the members rebuild each bucket and check its CRC-32C; a member that
// cannot reports received_ok false and completes the version over gRPC.
//
// Membership: the first generation takes every worker that joined within
// the join window. Beside a generation with members, newcomers (and a
// restarted worker under its old id) go through a trial first: a world of
// rank 0 and the newcomers alone, over a store of its own, built while the
// generation goes on receiving versions (weight_group_trial.cc). Only when
// the trial's rendezvous completes does the group end the generation at its
// next boundary and form the next one of its members and the proven
// newcomers; a trial that fails ends nothing. A generation also ends when a
// member has not asked within ready_timeout of the first member that asked,
// made no call for that long, or a broadcast or its rendezvous failed. The
// members are then told to join again (REJOIN); one that does not within
// the join window is left out. A failed rendezvous (a trial's or a
// generation's) keeps out for a while the members that made no Store call,
// or when every member did, the newcomers; their principal may bring no new
// worker id meanwhile (WorkerIds).
//
// The snapshots come from the snapshot store (snapshot_store.h), which the
// group reads like the other transports: nothing calls into the group when
// the learner publishes.
//
// Calls: the service is on gRPC's callback API, every method served raw:
// each request is checked on the wire (common/wire/wire_check.h) before it
// is parsed (INVALID_ARGUMENT naming the fault) and its bytes counted with
// every other request's. A Join, a Next or a store GET or WAIT that has to
// wait holds no thread: it is parked, and the group's answering thread
// finishes it once the group has its answer, its wait ends, the caller
// cancels or the group shuts down. At most max_waiting calls wait at once,
// and max_waiting_per_caller of one caller (a principal; a peer address
// where callers are anonymous): one more is RESOURCE_EXHAUSTED, counted as
// a refusal.
//
// Security: every call needs the role read_weights, like WeightBroadcast.
// A worker id belongs to the principal that joined it first (a peer host
// where callers are anonymous), and a principal holds a bounded number of
// them. A member sets, compare-sets and deletes only its own store keys,
// within bytes and keys per member and per generation.
// The collectives themselves run over Gloo's or NCCL's own TCP connections,
// unencrypted: rank 0 binds them to `address` (loopback by default).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_group.grpc.pb.h"
#include "common/security/authorizer.h"
#include "weight_broadcaster/snapshot_store.h"

namespace asympo::broadcast {

struct WeightGroupOptions {
  // "gloo" (host memory) or "nccl" (rank 0 on CUDA device `nccl_device`).
  std::string backend = "gloo";
  // The host name or address rank 0's Gloo transport binds to.
  std::string address = "127.0.0.1";
  int nccl_device = 0;
  // Timeout of the rendezvous and of each collective.
  absl::Duration timeout = absl::Seconds(60);
  // How long the group waits for every member to ask for a version once
  // one has asked and lacks the latest; the others are then left out.
  // Also how long a member may make no call at all.
  absl::Duration ready_timeout = absl::Seconds(60);
  // After a generation ends, how long the group gathers Joins.
  absl::Duration join_window = absl::Seconds(2);
  // Members of one generation at most (one more Join: RESOURCE_EXHAUSTED).
  int max_members = 256;
  // Calls waiting at once (Join, Next, store waits), in all, of one
  // caller (a principal) and of one member (its Next and store waits); one
  // more is RESOURCE_EXHAUSTED.
  int max_waiting = 1024;
  int max_waiting_per_caller = 256;
  int max_waiting_per_member = 16;
  // What the members set in one generation's store through Store (each
  // key's bytes plus its value's), in all and of one member; a SET, ADD or
  // COMPARE_SET beyond it is RESOURCE_EXHAUSTED. A Gloo rendezvous of 257
  // ranks sets about 10 MiB in all, under 64 KiB a rank.
  int64_t max_store_bytes = int64_t{64} << 20;
  int max_store_keys = 16384;
  int64_t max_store_bytes_per_member = int64_t{4} << 20;
  int max_store_keys_per_member = 1024;
  // Worker ids one principal (a peer host where callers are anonymous)
  // holds at once: an id is bound to whoever joined it first until it has
  // been out of the group for worker_id_ttl.
  int max_worker_ids_per_principal = 64;
  absl::Duration worker_id_ttl = absl::Minutes(10);
  // A worker blamed for a failed rendezvous is kept out for
  // rendezvous_backoff (its principal may bring no new worker id
  // meanwhile), doubled on each failure in a row up to max_rendezvous_backoff.
  absl::Duration rendezvous_backoff = absl::Seconds(10);
  absl::Duration max_rendezvous_backoff = absl::Minutes(5);
  // Who may join (role read_weights). Null: everyone, as "anonymous".
  security::Authorizer* authorizer = nullptr;
  // When set, the bytes of every request (CountReceived), before any check.
  std::atomic<int64_t>* received_bytes = nullptr;
  // Testing only: the last byte of each of these versions' delta buckets
  // is broadcast flipped (the members must fail the rebuilt bucket's CRC).
  std::vector<uint64_t> corrupt_delta_versions;
};

// The callback service with every method served raw (grpc::ByteBuffer).
using WeightGroupServiceBase =
    v1::WeightGroup::WithRawCallbackMethod_Join<v1::WeightGroup::WithRawCallbackMethod_Store<
        v1::WeightGroup::WithRawCallbackMethod_Next<v1::WeightGroup::Service>>>;

class WeightGroup final : public WeightGroupServiceBase {
 public:
  // Broadcasts the snapshots of `store` (which must outlive the group) to
  // the members that lack the latest; Join checks a worker's model against
  // the store's signature. INVALID_ARGUMENT for an unknown backend or a bad
  // option, and FAILED_PRECONDITION when this build lacks the backend's
  // process group.
  static absl::StatusOr<std::unique_ptr<WeightGroup>> Create(WeightGroupOptions options,
                                                             SnapshotStore& store,
                                                             prometheus::Registry& registry);
  ~WeightGroup() override;

  // Ends the group thread and every waiting call (UNAVAILABLE). Call it
  // before the server's Shutdown.
  void Shutdown();

  // For tests and the log: the current generation (0: none yet), its
  // members, and how many versions the group has broadcast.
  uint64_t generation() const;
  int members() const;
  int64_t versions_sent() const;

  // Requests and replies are the serialized messages of
  // proto/asympo/v1/weight_group.proto.
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Store(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Next(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  // Calls that are waiting for the group (tests).
  int waiting_calls() const;

  struct State;

 private:
  explicit WeightGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace asympo::broadcast
