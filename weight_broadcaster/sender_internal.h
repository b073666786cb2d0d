// Internals of BroadcastSender shared by broadcast_sender.cc (the service
// calls and the store's reader) and sender_streams.cc (the Subscribe and
// FetchSnapshot reactors). Not part of the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
#include "weight_broadcaster/session_registry.h"

namespace asympo::broadcast::internal {

class SubscribeReactor;

// BroadcastSender's state (BroadcastSender::State derives from it).
struct SenderState {
  SenderState(BroadcastSenderOptions o, SnapshotStore& store, prometheus::Registry& registry);

  using Session = SessionRegistry::Session;

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
  // A fetch that FetchSnapshot counted has ended.
  void FetchDone(const std::string& session_id);

  // The NCCL transport's life: off (never configured or unavailable),
  // handing out ranks, broadcasting, or failed (gRPC for all, for good).
  enum class NcclPhase { kOff, kCollecting, kRunning, kFailed };

  void UpdateReceiverGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Called by a Subscribe stream's OnDone: drops its session.
  void StreamDone(const std::string& session_id, SubscribeReactor* stream);
  void CountFailure() { metrics.failures.Increment(); }

  const BroadcastSenderOptions options;
  const absl::flat_hash_set<uint64_t> corrupt_versions;
  const absl::flat_hash_set<uint64_t> corrupt_delta_versions;
  SenderMetrics metrics;
  // Cancels fetches that stall or last too long.
  CallReaper reaper;
  // The lines a client can repeat in a loop: a receiver registering again,
  // a receiver's failure report (common/log_throttle.h).
  LogThrottle registered_again_log;
  LogThrottle failure_report_log;

  // What the sender serves, and its reader's id there (AddReader).
  SnapshotStore& store;
  int reader_id = -1;
  mutable absl::Mutex mu;
  // The version `session` holds of this incarnation: `version`, or 0 when
  // `incarnation` names another one (empty: unknown, taken as this one).
  uint64_t OwnVersionLocked(uint64_t version, const std::string& of) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return of.empty() || of == store.incarnation() ? version : 0;
  }
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  // The receivers' sessions: ownership, limits, expiry.
  SessionRegistry sessions ABSL_GUARDED_BY(mu);

  // NCCL (broadcast_sender.cc). While the phase is kCollecting or kRunning,
  // sessions with an NCCL rank get announcements only from nccl_thread,
  // one version at a time, right before its buckets are broadcast.
  std::string nccl_unique_id;  // set before nccl_thread starts
  NcclPhase nccl_phase ABSL_GUARDED_BY(mu) = NcclPhase::kOff;
  std::vector<std::string> nccl_receivers ABSL_GUARDED_BY(mu);  // [r - 1]: rank r's receiver
  // [r - 1]: whether rank r's receiver registered (last) with nccl_deltas.
  std::vector<bool> nccl_rank_deltas ABSL_GUARDED_BY(mu);
  NcclBroadcaster* nccl_comm ABSL_GUARDED_BY(mu) = nullptr;  // while running, for Cancel
  int64_t nccl_versions ABSL_GUARDED_BY(mu) = 0;
  int64_t nccl_delta_versions ABSL_GUARDED_BY(mu) = 0;
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
// again, else the next free one), noting whether that receiver takes
// deltas; returns the rank, or 0 (gRPC).
// CancelNcclLocked: aborts a broadcast in progress (Shutdown).
void StartNccl(SenderState& st);
int AssignNcclRankLocked(SenderState& st, SenderState::Session& session, bool deltas)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);
void CancelNcclLocked(SenderState& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu);

// FetchSnapshot reactors (sender_streams.cc): one that finishes at once with
// `refusal`, and one that streams `snapshot` in chunks of `chunk_bytes`
// (with `delta`, the buckets that have a delta as their delta).
grpc::ServerWriteReactor<grpc::ByteBuffer>* RefuseFetch(SenderState* state,
                                                        const grpc::Status& refusal);
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(SenderState* state,
                                                       grpc::CallbackServerContext* ctx,
                                                       std::string session_id,
                                                       std::shared_ptr<const Snapshot> snapshot,
                                                       uint64_t chunk_bytes, bool delta);

}  // namespace asympo::broadcast::internal
