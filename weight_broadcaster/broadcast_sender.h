// The gRPC transport of the weight broadcaster: the WeightBroadcast
// service that lives in the learner (docs/protocol.md, "Weight broadcast"),
// with the NCCL transport it hands ranks out for.
//
// It serves what the snapshot store holds (snapshot_store.h): the store
// hands it every snapshot the learner publishes, and it announces each to
// its subscribers. Receivers fetch the latest snapshot as chunks
// (FetchSnapshot). Only the latest snapshot is served: a snapshot that is
// still being fetched stays alive until its last fetch ends, even after a
// newer one replaces it, but a fetch that starts after the replacement gets
// NOT_FOUND (the receiver has the newer announcement waiting).
//
// Subscribe announces the latest snapshot at once if its version is greater
// than after_version, then every newer one. after_version 0 means "from the
// start": the latest is announced whatever its version, so that version 0
// (a fresh learner's initial weights) reaches new receivers too.
//
// Sessions: Register returns a session id; registering again with the same
// receiver id ends the old session. A session ends with its Subscribe
// stream, and calls naming an unknown or ended session get
// FAILED_PRECONDITION (the receiver registers again).
//
// Security: every call is authorized for the role read_weights
// (BroadcastSenderOptions::authorizer), and a session belongs to the
// principal that registered it: another principal can neither register
// under its receiver id nor use its session (PERMISSION_DENIED). Where
// callers are anonymous (no authorizer, or one that authenticates nobody)
// a session belongs to the connection that registered it: another
// connection may take its receiver id over only once it has stayed
// unsubscribed for kUnsubscribedTakeover. Registrations and fetches under
// way are limited per principal (per peer address where callers are
// anonymous) as well as in all. A Register's current_version above the
// latest published is recorded as the latest (refusing it, as ReportVersion
// does, would lock out the receivers of a learner restarted from an older
// checkpoint). The methods are served raw and parse their requests
// themselves (common/wire/wire_check.h): a request that does not parse is
// INVALID_ARGUMENT. A fetch that writes nothing for fetch_idle_timeout, or
// lasts longer than max_fetch_duration, is cancelled.
//
// NCCL (opt-in, BroadcastSenderOptions::nccl_world_size; sender_nccl.cc):
// receivers given an NCCL rank in Register are not announced anything by
// the store's publishes or Subscribe; a thread of the sender announces each version to
// them and broadcasts its buckets, one version at a time. When the
// communicator fails, everyone is on gRPC from then on.
//
// Memory: besides the store's latest snapshot, any older one a fetch
// still reads (the sender holds it until the fetch ends).
//
// Torch-free. Thread-safe; the gRPC callbacks never block on the trainer.
// The store must outlive the sender, and the sender the server that serves
// it; call Shutdown() before the server's Shutdown(), which
// otherwise waits for the Subscribe streams that never end by themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_broadcast.grpc.pb.h"
#include "common/clock.h"
#include "common/security/authorizer.h"
#include "weight_broadcaster/nccl/nccl_transport.h"
#include "weight_broadcaster/snapshot_manifest.h"
#include "weight_broadcaster/snapshot_plan.h"
#include "weight_broadcaster/snapshot_store.h"

namespace asympo::broadcast {

struct BroadcastSenderOptions {
  // Chunk size used when a fetch does not ask for one (max_chunk_bytes 0);
  // requests are capped at max_chunk_bytes_cap. A chunk message is the data
  // plus at most 44 bytes: the default (4 MiB less 64 KiB) fits gRPC's
  // default 4 MiB receive limit, so a client that asks for 0 can read it.
  uint32_t default_chunk_bytes = (4u << 20) - (64u << 10);
  uint32_t max_chunk_bytes_cap = 32u << 20;
  // Smaller requests are raised to this: a 1-byte chunk costs a message (and
  // a CRC-free 44-byte frame) per byte of the snapshot.
  uint32_t min_chunk_bytes = 64u << 10;
  // A registration that has not subscribed within this ends; at most
  // max_sessions registrations are held (one more is RESOURCE_EXHAUSTED).
  absl::Duration unsubscribed_session_ttl = absl::Minutes(1);
  int max_sessions = 4096;
  // Of them, the most one principal (one peer address without
  // authentication) may hold; 0: a quarter.
  int max_sessions_per_principal = 0;
  // Fetches under way at once, in all and per session; one more is
  // RESOURCE_EXHAUSTED. Each holds its snapshot in memory until it ends, so
  // fetches that are never read would otherwise pin old snapshots without
  // bound. A receiver fetches one version at a time.
  int max_concurrent_fetches = 256;
  int max_fetches_per_session = 2;
  // Of max_concurrent_fetches, the most one principal (one peer address
  // without authentication) may have under way; 0: a quarter.
  int max_fetches_per_principal = 0;
  // A session's failure reports (ReportVersion with an error) count in
  // asympo_broadcast_failures_total at most once per this interval.
  absl::Duration failure_count_interval = absl::Seconds(10);
  // The time that registrations expire and failure reports are spaced in
  // (tests pass a fake one to expire a registration without waiting).
  // Outlives the sender.
  const Clock* clock = RealClock();
  // A fetch whose receiver takes no chunk for this long, or that lasts
  // longer than the second, is cancelled (its snapshot is let go).
  absl::Duration fetch_idle_timeout = absl::Minutes(1);
  absl::Duration max_fetch_duration = absl::Minutes(30);
  // Who may fetch weights (role read_weights). Null: everyone, as
  // "anonymous".
  security::Authorizer* authorizer = nullptr;
  // Fault injection, for tests and drills only: flip one byte of the first
  // chunk sent for each of these versions (after the checksum was taken), or
  // the last byte of the first bucket sent as a delta of each of the second
  // list (in a fetch, or in the NCCL broadcast), and sleep this long before
  // each chunk.
  std::vector<uint64_t> corrupt_versions;
  std::vector<uint64_t> corrupt_delta_versions;
  absl::Duration chunk_delay = absl::ZeroDuration();

  // When set, the bytes of every request (CountReceived), before any check.
  std::atomic<int64_t>* received_bytes = nullptr;

  // The NCCL transport (off by default; see "NCCL" in docs/protocol.md).
  // With nccl_world_size N >= 2 the sender is rank 0 of an N-rank
  // communicator: the first N - 1 receivers that list TRANSPORT_NCCL first
  // get ranks 1..N-1; once all have registered, the sender joins on a thread
  // of its own and then broadcasts every version it announces to them over
  // NCCL. 0 (or 1) keeps every receiver on gRPC. Also gRPC when the NCCL or
  // CUDA libraries cannot be loaded or no GPU is visible (logged), for late
  // joiners once the world is full, and for everyone after the communicator
  // fails (watchdog, a rank gone): the sender never builds a second one.
  int nccl_world_size = 0;
  int nccl_device = 0;  // CUDA device of rank 0
  NcclBroadcasterOptions nccl;
};

// The callback service with every method served raw (grpc::ByteBuffer):
// requests are checked on the wire before they are parsed, and
// FetchSnapshot's chunks are written as a small header plus a slice that
// points into the snapshot, never copied through a WeightChunk message
// (wire_format.h). On the wire they are ordinary messages.
using WeightBroadcastServiceBase = v1::WeightBroadcast::WithRawCallbackMethod_Register<
    v1::WeightBroadcast::WithRawCallbackMethod_Subscribe<
        v1::WeightBroadcast::WithRawCallbackMethod_FetchSnapshot<
            v1::WeightBroadcast::WithRawCallbackMethod_ReportVersion<
                v1::WeightBroadcast::Service>>>>;

class BroadcastSender final : public WeightBroadcastServiceBase {
 public:
  // Serves the snapshots of `store`, which must outlive the sender;
  // Register refuses receivers whose model signature is not the store's.
  // The sender's metrics are registered in `registry`, which must outlive
  // it.
  BroadcastSender(BroadcastSenderOptions options, SnapshotStore& store,
                  prometheus::Registry& registry);
  ~BroadcastSender() override;

  // Whether the NCCL transport was asked for (nccl_world_size >= 2): only
  // then are DeviceBuckets of use.
  bool nccl_configured() const;

  // Ends every open Subscribe stream (the daemon calls it before shutting
  // the server down) and refuses new registrations and subscriptions with
  // UNAVAILABLE. Fetches in flight run on.
  void Shutdown();

  // Receivers registered and still subscribed.
  int active_receivers() const;
  // Version each registered receiver last reported (at Register or with
  // ReportVersion), sorted by receiver id.
  std::vector<std::pair<std::string, uint64_t>> receiver_versions() const;
  // NCCL: whether the communicator is up and in use, how many versions it
  // has broadcast, and how many of those as deltas.
  bool nccl_active() const;
  int64_t nccl_versions_sent() const;
  int64_t nccl_delta_versions_sent() const;

  // WeightBroadcast, raw: requests and replies are the serialized messages
  // of proto/asympo/v1/weight_broadcast.proto. Register: INVALID_ARGUMENT
  // for a receiver_id that is empty or over 128 bytes, FAILED_PRECONDITION
  // for another model's signature (the learner's is not echoed: GetStatus
  // gives it to a caller with the status role). ReportVersion: an error in
  // the request is logged and counted in asympo_broadcast_failures_total.
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Subscribe(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchSnapshot(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ReportVersion(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

 private:
  // The calls once authorized (for `principal`) and parsed.
  grpc::Status DoRegister(const std::string& principal, const std::string& share_key,
                          const v1::RegisterRequest& request, v1::RegisterResponse* response);
  grpc::Status DoReportVersion(const std::string& principal,
                               const v1::ReportVersionRequest& request);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace asympo::broadcast
