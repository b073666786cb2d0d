// The sender side of the weight broadcaster: the WeightBroadcast gRPC
// service that lives in the learner (docs/protocol.md, "Weight broadcast").
//
// The sender owns the snapshot's bucket layout: Plan() makes it once
// (SnapshotPlan, snapshot_plan.h), and the learner's staging writes its host
// copy already laid out as those buckets. Publish(version, host) adopts that
// memory as the snapshot's buckets (no copy), stamps each bucket's CRC-32C,
// keeps the snapshot as the latest one, and announces it to every
// subscriber; Publish(version, tensors) first packs loose tensors into
// buckets of its own. Receivers fetch it as chunks (FetchSnapshot). Only the
// latest snapshot is served: a snapshot that is still being fetched stays
// alive until its last fetch ends, even after a newer one replaces it, but a
// fetch that starts after the replacement gets NOT_FOUND (the receiver has
// the newer announcement waiting).
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
// themselves (common/wire/wire_check.h): a request that does not parse is INVALID_ARGUMENT. A fetch
// that writes nothing for fetch_idle_timeout, or lasts longer than max_fetch_duration, is
// cancelled.
//
// NCCL (opt-in, BroadcastSenderOptions::nccl_world_size; sender_nccl.cc):
// receivers given an NCCL rank in Register are not announced anything by
// Publish or Subscribe; a thread of the sender announces each version to
// them and broadcasts its buckets, one version at a time. When the
// communicator fails, everyone is on gRPC from then on.
//
// Memory: the latest snapshot's buckets (host memory the publisher handed
// over, held until no fetch reads them), plus any older snapshot a fetch
// still reads; the publisher reuses a buffer once the sender lets it go.
// Publish(version, tensors) keeps its own buffers the same way.
//
// Torch-free: tensors arrive as raw byte views. Thread-safe; the gRPC
// callbacks never block on the trainer. The sender must outlive the server
// that serves it; call Shutdown() before the server's Shutdown(), which
// otherwise waits for the Subscribe streams that never end by themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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

namespace asympo::broadcast {

// One tensor to publish: its spec and its bytes (size must equal
// product(shape) * DTypeSize(dtype)). The bytes are copied during Publish.
struct TensorView {
  TensorSpec spec;
  const void* data = nullptr;
  uint64_t size_bytes = 0;
};

// A snapshot's bytes in host memory laid out as `plan` says (the sender's:
// BroadcastSender::Plan): plan->flat_bytes() bytes at `data`, bucket b at
// data + plan->bucket_start(b), the gaps inside buckets zero. Publish adopts
// them as the snapshot's buckets: `keep_alive` holds the memory until the
// sender and every fetch have let the snapshot go, and the bytes must not
// change meanwhile.
struct HostBuckets {
  std::shared_ptr<const SnapshotPlan> plan;
  char* data = nullptr;
  std::shared_ptr<void> keep_alive;
};

// The same bytes in GPU memory, laid out the same way, for the NCCL
// transport to broadcast straight from the device. `keep_alive` holds that
// memory until the sender lets the snapshot go.
struct DeviceBuckets {
  const void* data = nullptr;  // on the NCCL device; null: none
  std::shared_ptr<const void> keep_alive;
};

struct BroadcastSenderOptions {
  PackingOptions packing;
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
  // chunk sent for each of these versions (after the checksum was taken), and
  // sleep this long before each chunk.
  std::vector<uint64_t> corrupt_versions;
  absl::Duration chunk_delay = absl::ZeroDuration();

  // When set, the bytes of every request (CountReceived), before any check.
  std::atomic<int64_t>* received_bytes = nullptr;

  // The learner process's incarnation (LearnerStatus.incarnation) that
  // every manifest and registration carries; SetIncarnation may replace it
  // before the first Publish.
  std::string incarnation;

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
  // `model_signature` is ModelSignature() of the tensors every Publish will
  // carry; Register refuses receivers with another one. The sender's
  // metrics are registered in `registry`, which must outlive it.
  BroadcastSender(BroadcastSenderOptions options, std::string model_signature,
                  prometheus::Registry& registry);
  ~BroadcastSender() override;

  // The bucket layout of every snapshot (PlanSnapshot with the options'
  // packing), made on the first call and the same object afterwards.
  // INVALID_ARGUMENT when the specs' signature differs from model_signature
  // (or PlanSnapshot refuses them).
  absl::StatusOr<std::shared_ptr<const SnapshotPlan>> Plan(const std::vector<TensorSpec>& specs);

  // Announces version `version` with `host` as its buckets (adopted, not
  // copied; their checksums are taken here). INVALID_ARGUMENT when `host`
  // is not laid out by this sender's Plan, or `version` is not greater than
  // the latest published one (the first Publish may use any version, e.g.
  // the one restored from a checkpoint). With `device` (non-null), the NCCL
  // transport broadcasts the buckets from there instead of from host memory.
  absl::Status Publish(uint64_t version, HostBuckets host, const DeviceBuckets* device = nullptr);
  // Copies `tensors` into buckets laid out by Plan, then publishes them as
  // above. INVALID_ARGUMENT also when the tensors' signature differs from
  // model_signature or a view's size is wrong.
  absl::Status Publish(uint64_t version, const std::vector<TensorView>& tensors);
  // Called after every Publish, and at once with the latest snapshot if
  // there is one, with the snapshot's manifest (checksums stamped) and its
  // host bytes, which `host.keep_alive` keeps alive for as long as the hook's
  // receiver holds them (the learner's weight group). Called on the
  // publishing thread, outside the sender's locks: it must not block.
  using PublishHook =
      std::function<void(std::shared_ptr<const v1::SnapshotManifest> manifest, HostBuckets host)>;
  void SetPublishHook(PublishHook hook);
  // Whether the NCCL transport was asked for (nccl_world_size >= 2): only
  // then are DeviceBuckets of use.
  bool nccl_configured() const;

  // The incarnation and the checkpoint version it resumed from that every
  // later manifest carries (SnapshotManifest.incarnation). A receiver that
  // registers or reports a version of another incarnation counts as holding
  // none of this one's (version 0 in the receiver gauges).
  void SetIncarnation(std::string incarnation, uint64_t resumed_from_version);

  // Ends every open Subscribe stream (the daemon calls it before shutting
  // the server down) and refuses new registrations and subscriptions with
  // UNAVAILABLE. Fetches in flight run on.
  void Shutdown();

  uint64_t latest_version() const;
  // Receivers registered and still subscribed.
  int active_receivers() const;
  // The signature every published snapshot carries (the constructor's).
  const std::string& model_signature() const;
  // Version each registered receiver last reported (at Register or with
  // ReportVersion), sorted by receiver id.
  std::vector<std::pair<std::string, uint64_t>> receiver_versions() const;
  // NCCL: whether the communicator is up and in use, and how many versions
  // it has broadcast.
  bool nccl_active() const;
  int64_t nccl_versions_sent() const;

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
