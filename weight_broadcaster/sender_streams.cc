#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include <grpcpp/alarm.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/wire/raw_messages.h"
#include "weight_broadcaster/sender_internal.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast::internal {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Releases the snapshot reference a chunk's data slice holds.
void ReleaseSnapshot(void* ref) { delete static_cast<std::shared_ptr<const Snapshot>*>(ref); }

// FetchSnapshot: streams one snapshot's buckets as chunks, one write at a
// time (HTTP/2 flow control paces it). Each chunk is a small encoded header
// and a slice of the bucket itself; the slice holds a reference to the
// snapshot for as long as gRPC holds the slice.
class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(SenderState* state, const grpc::Status& refusal) : state_(state) {
    absl::MutexLock lock(&mu_);
    FinishLocked(refusal);
  }

  FetchReactor(SenderState* state, grpc::CallbackServerContext* ctx, std::string session_id,
               std::shared_ptr<const Snapshot> snapshot, uint64_t chunk_bytes, bool delta)
      : state_(state),
        session_id_(std::move(session_id)),
        snapshot_(std::move(snapshot)),
        delta_(delta ? snapshot_->delta.get() : nullptr),
        chunk_bytes_(chunk_bytes),
        corrupt_(state->corrupt_versions.contains(snapshot_->version())),
        corrupt_delta_(delta_ != nullptr &&
                       state->corrupt_delta_versions.contains(snapshot_->version())),
        start_(std::chrono::steady_clock::now()),
        reaped_(state->reaper.Add(ctx, state->options.fetch_idle_timeout,
                                  state->options.max_fetch_duration)) {
    absl::MutexLock lock(&mu_);
    NextLocked();
  }

  void OnWriteDone(bool ok) override {
    if (reaped_ != 0) state_->reaper.Touch(reaped_);
    absl::MutexLock lock(&mu_);
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "receiver went away"));
      return;
    }
    state_->metrics.bytes.Increment(static_cast<double>(last_size_));
    NextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    // A write in flight fails by itself; a pending delay must be cut short.
    if (delaying_) alarm_.Cancel();
  }

  void OnDone() override {
    bool failed;
    {
      absl::MutexLock lock(&mu_);
      failed = snapshot_ != nullptr && !succeeded_;
    }
    if (failed) state_->CountFailure();
    if (reaped_ != 0) state_->reaper.Remove(reaped_);
    {
      absl::MutexLock lock(&mu_);
      ReleaseLocked();  // when the RPC ended without Finish (it does not, but the count must drop)
    }
    delete this;
  }

 private:
  // Builds and writes the next chunk, or finishes after the last one.
  void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled"));
      return;
    }
    const v1::SnapshotManifest& m = snapshot_->manifest();
    while (bucket_ < m.buckets_size() && offset_ >= SizeOf(bucket_)) {
      ++bucket_;
      offset_ = 0;
    }
    if (bucket_ >= m.buckets_size()) {
      succeeded_ = true;
      state_->metrics.transfer_seconds.Observe(SecondsSince(start_));
      FinishLocked(grpc::Status::OK);
      return;
    }
    const std::string* delta = DeltaOf(bucket_);
    const uint64_t size = SizeOf(bucket_);
    const uint64_t n = std::min(chunk_bytes_, size - offset_);
    // const: gRPC only reads a slice it did not allocate.
    char* data = delta != nullptr ? const_cast<char*>(delta->data()) + offset_
                                  : snapshot_->bucket(bucket_) + offset_;
    grpc::Slice slices[2] = {
        grpc::Slice(EncodeChunkHeader(snapshot_->version(), static_cast<uint32_t>(bucket_), offset_,
                                      n, delta != nullptr ? size : 0)),
        grpc::Slice()};
    const bool corrupt_delta = corrupt_delta_ && delta != nullptr && offset_ + n == size;
    if ((corrupt_ && !corrupted_) || (corrupt_delta && !corrupted_)) {
      // Fault injection: a private copy with one byte flipped, after the
      // checksum was taken (a delta's last byte: a value, or its header).
      std::string bad(data, n);
      bad[corrupt_ ? 0 : n - 1] ^= 0x5a;
      slices[1] = grpc::Slice(bad);
      corrupted_ = true;
    } else {
      slices[1] =
          grpc::Slice(data, n, &ReleaseSnapshot, new std::shared_ptr<const Snapshot>(snapshot_));
    }
    chunk_ = grpc::ByteBuffer(slices, 2);
    last_size_ = n;
    offset_ += n;
    if (state_->options.chunk_delay > absl::ZeroDuration()) {
      delaying_ = true;
      alarm_.Set(absl::ToChronoTime(absl::Now() + state_->options.chunk_delay),
                 [this](bool fired) { AfterDelay(fired); });
      return;
    }
    StartWrite(&chunk_);
  }

  // Bucket b's delta when this fetch sends it as one, else null.
  const std::string* DeltaOf(int b) const {
    if (delta_ == nullptr || delta_->buckets[static_cast<size_t>(b)].empty()) return nullptr;
    return &delta_->buckets[static_cast<size_t>(b)];
  }
  // The bytes this fetch sends of bucket b.
  uint64_t SizeOf(int b) const {
    const std::string* d = DeltaOf(b);
    return d != nullptr ? d->size() : snapshot_->manifest().buckets(b).size_bytes();
  }

  void AfterDelay(bool fired) {
    absl::MutexLock lock(&mu_);
    delaying_ = false;
    if (!fired || cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled"));
      return;
    }
    StartWrite(&chunk_);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    // Before Finish, not in OnDone: the receiver sees the stream end once
    // Finish is called and may fetch again at once; OnDone comes later.
    ReleaseLocked();
    Finish(status);
  }

  // Gives the fetch's place back (FetchSnapshot counted it), once.
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (snapshot_ == nullptr || released_) return;
    released_ = true;
    state_->FetchDone(session_id_);
  }

  SenderState* const state_;
  const std::string session_id_;
  const std::shared_ptr<const Snapshot> snapshot_;  // null for a refused fetch
  const SnapshotDelta* const delta_ = nullptr;      // snapshot_'s, when sent as a delta
  const uint64_t chunk_bytes_ = 0;
  const bool corrupt_ = false;
  const bool corrupt_delta_ = false;
  const std::chrono::steady_clock::time_point start_;
  const uint64_t reaped_ = 0;  // the reaper's handle (0: a refused fetch)
  absl::Mutex mu_;
  grpc::ByteBuffer chunk_ ABSL_GUARDED_BY(mu_);
  uint64_t last_size_ ABSL_GUARDED_BY(mu_) = 0;
  int bucket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Alarm alarm_;
  bool delaying_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool corrupted_ ABSL_GUARDED_BY(mu_) = false;
  bool succeeded_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

SenderState::SenderState(BroadcastSenderOptions o, SnapshotStore& snapshots,
                         prometheus::Registry& registry)
    : options(std::move(o)),
      corrupt_versions(options.corrupt_versions.begin(), options.corrupt_versions.end()),
      corrupt_delta_versions(options.corrupt_delta_versions.begin(),
                             options.corrupt_delta_versions.end()),
      metrics(registry),
      store(snapshots),
      sessions(options) {}

void SenderState::FetchDone(const std::string& session_id) {
  absl::MutexLock lock(&mu);
  sessions.FetchDone(session_id);
}

grpc::Status SenderState::Authorize(const grpc::CallbackServerContext& ctx, std::string* principal,
                                    std::string* share_key) const {
  absl::StatusOr<const security::Principal*> p =
      security::AuthorizeCall(options.authorizer, ctx, security::Role::kReadWeights);
  if (!p.ok()) return ToGrpcStatus(p.status());
  *principal = anonymous() ? ctx.peer() : (*p)->name;
  if (share_key != nullptr) *share_key = security::ShareKey(options.authorizer, **p, ctx);
  return grpc::Status::OK;
}

void SenderState::UpdateReceiverGauges() {
  const std::vector<uint64_t> versions = sessions.versions_in_use();
  metrics.receivers.Set(sessions.subscribed());
  metrics.versions_in_use.Set(static_cast<double>(versions.size()));
  metrics.oldest_version.Set(versions.empty() ? 0.0 : static_cast<double>(versions.front()));
}

void SenderState::StreamDone(const std::string& session_id, SubscribeReactor* stream) {
  absl::MutexLock lock(&mu);
  if (sessions.EndWithStream(session_id, stream)) UpdateReceiverGauges();
}

SubscribeReactor::SubscribeReactor(SenderState* state, const grpc::Status& refusal)
    : state_(state) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  Finish(refusal);
}

SubscribeReactor::SubscribeReactor(SenderState* state, std::string session_id,
                                   uint64_t after_version)
    : state_(state), session_id_(std::move(session_id)) {
  if (after_version > 0) floor_ = after_version;
  // Tells the receiver it is subscribed even before the first announcement.
  StartSendInitialMetadata();
}

void SubscribeReactor::Offer(std::shared_ptr<const v1::SnapshotAnnouncement> a) {
  absl::MutexLock lock(&mu_);
  if (finished_ || end_.has_value()) return;
  const uint64_t v = a->manifest().version();
  if ((floor_.has_value() && v <= *floor_) || (next_ && v <= next_->manifest().version())) return;
  next_ = std::move(a);
  PumpLocked();
}

void SubscribeReactor::End(grpc::Status status) {
  absl::MutexLock lock(&mu_);
  if (finished_ || end_.has_value()) return;
  end_ = std::move(status);
  next_.reset();
  PumpLocked();
}

void SubscribeReactor::OnSendInitialMetadataDone(bool ok) {
  if (!ok) End(grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away"));
}

void SubscribeReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_.reset();
  if (!ok && !end_.has_value()) {
    end_ = grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away");
    next_.reset();
  }
  PumpLocked();
}

void SubscribeReactor::OnCancel() { End(grpc::Status::CANCELLED); }

void SubscribeReactor::OnDone() {
  if (!session_id_.empty()) state_->StreamDone(session_id_, this);
  delete this;
}

// Starts the next write, or finishes. gRPC never runs OnWriteDone or OnDone
// inline in StartWrite/Finish, so holding mu_ here is safe.
void SubscribeReactor::PumpLocked() {
  if (finished_ || writing_) return;
  if (end_.has_value()) {
    finished_ = true;
    Finish(*end_);
    return;
  }
  if (!next_) return;
  writing_ = std::move(next_);
  floor_ = writing_->manifest().version();
  SerializeReply(*writing_, &written_);
  StartWrite(&written_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RefuseFetch(SenderState* state,
                                                        const grpc::Status& refusal) {
  return new FetchReactor(state, refusal);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(SenderState* state,
                                                       grpc::CallbackServerContext* ctx,
                                                       std::string session_id,
                                                       std::shared_ptr<const Snapshot> snapshot,
                                                       uint64_t chunk_bytes, bool delta) {
  return new FetchReactor(state, ctx, std::move(session_id), std::move(snapshot), chunk_bytes,
                          delta);
}

}  // namespace asympo::broadcast::internal
