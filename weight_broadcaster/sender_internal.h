// Internals of BroadcastSender shared by broadcast_sender.cc (the service
// calls and Publish) and sender_streams.cc (the Subscribe and FetchSnapshot
// reactors). Not part of the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "common/listener/call_reaper.h"
#include "common/log_throttle.h"
#include "weight_broadcaster/broadcast_metrics.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace asympo::broadcast::internal {

// A published snapshot. The announcement (manifest only) is shared
// separately so that a slow subscriber never pins the bytes; the bytes (the
// adopted host buckets) live while the sender holds the snapshot as its
// latest or a fetch (or a chunk inside gRPC) still reads them.
struct Snapshot {
  std::shared_ptr<const v1::SnapshotAnnouncement> announcement;
  HostBuckets host;      // the bytes, laid out by host.plan
  DeviceBuckets device;  // the same bytes on the NCCL device, if given

  const v1::SnapshotManifest& manifest() const { return announcement->manifest(); }
  uint64_t version() const { return manifest().version(); }
  // Manifest bucket b's bytes in host memory, and on the device (null
  // without device buckets).
  char* bucket(int b) const { return host.data + host.plan->bucket_start(b); }
  const void* device_bucket(int b) const {
    return device.data == nullptr
               ? nullptr
               : static_cast<const char*>(device.data) + host.plan->bucket_start(b);
  }
};

class SubscribeReactor;

// BroadcastSender's state (BroadcastSender::State derives from it).
// Where callers are anonymous, how long a registration must stay
// unsubscribed before another connection may take its receiver id over (its
// own connection may have gone; a receiver subscribes within milliseconds).
inline constexpr absl::Duration kUnsubscribedTakeover = absl::Seconds(5);

struct SenderState {
  SenderState(BroadcastSenderOptions o, std::string signature, prometheus::Registry& registry);

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

  // The caller's owner name if it may read weights; else the refusal. The
  // owner is the principal's name where callers authenticate, else the
  // caller's peer string (its connection): anonymous callers share one
  // principal, and a receiver id must not be theirs to take over.
  // `share_key`, when given, gets security::ShareKey.
  grpc::Status Authorize(const grpc::CallbackServerContext& ctx, std::string* principal,
                         std::string* share_key = nullptr) const;
  // Whether callers are anonymous (owners are connections).
  bool anonymous() const {
    return options.authorizer == nullptr || !options.authorizer->authenticates();
  }
  // The session `session_id` if it exists and belongs to `principal`:
  // FAILED_PRECONDITION for an unknown one, PERMISSION_DENIED for another
  // principal's.
  grpc::Status FindSessionLocked(const std::string& session_id, const std::string& principal,
                                 Session** session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Whether session `session_id` (of a receiver id being registered again)
  // is another owner's, one `principal` may not replace. Where callers are
  // anonymous, an owner is a connection, which may have gone: its session
  // may be taken over once it has stayed unsubscribed for
  // kUnsubscribedTakeover.
  bool TakenByAnotherLocked(const std::string& session_id, const std::string& principal) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // OK when a new registration of receiver `id` fits: within max_sessions
  // in all (unless it is `replacing` its own) and within the per-principal
  // share of `share_key`; else RESOURCE_EXHAUSTED, counted.
  grpc::Status RegistrationRoomLocked(bool replacing, const std::string& id,
                                      const std::string& share_key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A fetch that FetchSnapshot counted has ended.
  void FetchDone(const std::string& session_id);

  // Ends sessions that never subscribed within options.unsubscribed_session_ttl
  // (a registration left behind, or a flood of them).
  void ExpireUnsubscribedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The NCCL transport's life: off (never configured or unavailable),
  // handing out ranks, broadcasting, or failed (gRPC for all, for good).
  enum class NcclPhase { kOff, kCollecting, kRunning, kFailed };

  void UpdateReceiverGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Called by a Subscribe stream's OnDone: drops its session.
  void StreamDone(const std::string& session_id, SubscribeReactor* stream);
  void CountFailure() { metrics.failures.Increment(); }

  const BroadcastSenderOptions options;
  const std::string model_signature;
  const absl::flat_hash_set<uint64_t> corrupt_versions;
  SenderMetrics metrics;
  // Cancels fetches that stall or last too long.
  CallReaper reaper;
  // The lines a client can repeat in a loop: a receiver registering again,
  // a receiver's failure report (common/log_throttle.h).
  LogThrottle registered_again_log;
  LogThrottle failure_report_log;

  // The bucket layout of every snapshot, made by the first Plan call.
  absl::Mutex plan_mu;
  std::shared_ptr<const SnapshotPlan> plan ABSL_GUARDED_BY(plan_mu);

  absl::Mutex publish_mu;  // serializes Publish calls
  // Publish(version, tensors)'s buffers, laid out by `plan`: one is reused
  // once no snapshot holds it (it is then already faulted in).
  std::vector<std::shared_ptr<char>> tensor_buffers ABSL_GUARDED_BY(publish_mu);
  mutable absl::Mutex mu;
  std::shared_ptr<const Snapshot> latest ABSL_GUARDED_BY(mu);
  BroadcastSender::PublishHook publish_hook ABSL_GUARDED_BY(mu);
  // BroadcastSender::SetIncarnation's.
  std::string incarnation ABSL_GUARDED_BY(mu);
  uint64_t resumed_from_version ABSL_GUARDED_BY(mu) = 0;
  // The version `session` holds of this incarnation: `version`, or 0 when
  // `incarnation` names another one (empty: unknown, taken as this one).
  uint64_t OwnVersionLocked(uint64_t version, const std::string& of) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return of.empty() || of == incarnation ? version : 0;
  }
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<std::string, Session> sessions ABSL_GUARDED_BY(mu);  // by session id
  absl::flat_hash_map<std::string, std::string> session_of
      ABSL_GUARDED_BY(mu);  // receiver -> session
  std::mt19937_64 rng ABSL_GUARDED_BY(mu);
  int fetches ABSL_GUARDED_BY(mu) = 0;  // under way, all sessions
  // Fetches under way by share key, and each fetching session's key and
  // count (a session may end before its fetches do).
  absl::flat_hash_map<std::string, int> fetches_by_key ABSL_GUARDED_BY(mu);
  struct Fetching {
    std::string share_key;
    int count = 0;
  };
  absl::flat_hash_map<std::string, Fetching> fetching ABSL_GUARDED_BY(mu);  // by session id

  // NCCL (broadcast_sender.cc). While the phase is kCollecting or kRunning,
  // sessions with an NCCL rank get announcements only from nccl_thread,
  // one version at a time, right before its buckets are broadcast.
  std::string nccl_unique_id;  // set before nccl_thread starts
  NcclPhase nccl_phase ABSL_GUARDED_BY(mu) = NcclPhase::kOff;
  std::vector<std::string> nccl_receivers ABSL_GUARDED_BY(mu);  // [r - 1]: rank r's receiver
  NcclBroadcaster* nccl_comm ABSL_GUARDED_BY(mu) = nullptr;     // while running, for Cancel
  int64_t nccl_versions ABSL_GUARDED_BY(mu) = 0;
  absl::CondVar nccl_cv;  // with mu: registrations, publishes, shutdown
  std::thread nccl_thread;

  bool UsesNcclLocked(const Session& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return s.nccl_rank > 0 &&
           (nccl_phase == NcclPhase::kCollecting || nccl_phase == NcclPhase::kRunning);
  }
};

// Subscribe: writes announcements as they are offered. Keeps at most one
// waiting announcement (the newest): a slow subscriber skips versions rather
// than queueing them. Deletes itself in OnDone.
class SubscribeReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // A stream refused at once.
  SubscribeReactor(SenderState* state, const grpc::Status& refusal);
  // An accepted stream; the caller registers it with its session.
  // after_version 0 accepts every version, 0 included (see BroadcastSender).
  SubscribeReactor(SenderState* state, std::string session_id, uint64_t after_version);

  // Queues `a` unless it is not newer than what this stream already carries.
  void Offer(std::shared_ptr<const v1::SnapshotAnnouncement> a);
  // Finishes the stream with `status` once the write in flight completes.
  void End(grpc::Status status);

  void OnSendInitialMetadataDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SenderState* const state_;
  const std::string session_id_;  // empty for a refused stream
  absl::Mutex mu_;
  // Announced versions must exceed this; none for a stream that asked for
  // everything (after_version 0) and has not been sent anything yet.
  std::optional<uint64_t> floor_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const v1::SnapshotAnnouncement> writing_ ABSL_GUARDED_BY(mu_);  // in flight
  grpc::ByteBuffer written_ ABSL_GUARDED_BY(mu_);  // writing_, serialized
  std::shared_ptr<const v1::SnapshotAnnouncement> next_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// The NCCL transport (sender_nccl.cc).
// StartNccl, from the constructor: checks that NCCL and a GPU are usable,
// makes the unique id and starts st.nccl_thread (or logs why not and leaves
// the phase kOff). AssignNcclRankLocked: gives `session` an NCCL rank while
// ranks are being handed out (its receiver's earlier rank if it registers
// again, else the next free one); returns the rank, or 0 (gRPC).
// CancelNcclLocked: aborts a broadcast in progress (Shutdown).
void StartNccl(SenderState& st);
int AssignNcclRankLocked(SenderState& st, SenderState::Session& session)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
void CancelNcclLocked(SenderState& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);

// FetchSnapshot reactors (sender_streams.cc): one that finishes at once with
// `refusal`, and one that streams `snapshot` in chunks of `chunk_bytes`.
grpc::ServerWriteReactor<grpc::ByteBuffer>* RefuseFetch(SenderState* state,
                                                        const grpc::Status& refusal);
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(SenderState* state,
                                                       grpc::CallbackServerContext* ctx,
                                                       std::string session_id,
                                                       std::shared_ptr<const Snapshot> snapshot,
                                                       uint64_t chunk_bytes);

}  // namespace asympo::broadcast::internal
