#include "weight_broadcaster/snapshot_fetch.h"

#include <utility>

#include <glog/logging.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/str_cat.h"
#include "asympo/v1/weight_broadcast.grpc.pb.h"  // protobuf serialization for the request
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "weight_broadcaster/delta_codec.h"
#include "weight_broadcaster/snapshot_delta.h"
#include "weight_broadcaster/snapshot_manifest.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {

namespace {

// What one fetch has received, bucket by bucket: each bucket whole (into
// the snapshot, checksummed on the way) or as a delta (into a buffer of its
// own, rebuilt from the base's bucket at the end).
class Reception {
 public:
  Reception(ReceivedSnapshot* out, const ReceivedSnapshot* base)
      : out_(out),
        base_(base),
        received_(out->buckets.size(), 0),
        crc_(out->buckets.size(), 0),
        kind_(out->buckets.size(), Kind::kUnknown),
        delta_(out->buckets.size()) {}

  absl::Status Take(const std::vector<grpc::Slice>& slices, const ChunkView& c, uint64_t version) {
    const uint64_t b = c.bucket;
    if (c.version != version)
      return absl::DataLossError(absl::StrCat("chunk of version ", c.version));
    if (b >= out_->buckets.size()) {
      return absl::DataLossError(
          absl::StrCat("chunk for bucket ", b, " of ", out_->buckets.size()));
    }
    ASYMPO_RETURN_IF_ERROR(Decide(b, c.delta_bytes));
    std::string& dest = kind_[b] == Kind::kDelta ? delta_[b] : out_->buckets[b];
    if (c.offset != received_[b] || c.size > dest.size() - received_[b]) {
      return absl::DataLossError(absl::StrCat(
          "bucket ", b, kind_[b] == Kind::kDelta ? "'s delta" : "", ": chunk at offset ", c.offset,
          " of ", c.size, " bytes after ", received_[b], " of ", dest.size(), " bytes"));
    }
    uint32_t unused = 0;  // a delta is checked by the bucket it rebuilds
    CopyChunkData(slices, c, dest.data() + received_[b],
                  kind_[b] == Kind::kDelta ? &unused : &crc_[b]);
    received_[b] += c.size;
    return absl::OkStatus();
  }

  // Rebuilds the buckets that came as deltas, then checks every bucket's
  // size and CRC-32C.
  absl::Status Finish(const v1::SnapshotManifest& m, bool* delta_failed) {
    for (size_t b = 0; b < out_->buckets.size(); ++b) {
      const v1::BucketInfo& info = m.buckets(static_cast<int>(b));
      const bool delta = kind_[b] == Kind::kDelta;
      const uint64_t want = delta ? delta_[b].size() : info.size_bytes();
      if (received_[b] != want) {
        return absl::DataLossError(absl::StrCat("bucket ", b, delta ? "'s delta" : "",
                                                " is incomplete: ", received_[b], " of ", want,
                                                " bytes"));
      }
      if (delta) {
        ++deltas_;
        absl::Status s = SnapshotFetcher::RebuildBucket(*base_, static_cast<int>(b), delta_[b],
                                                        info.crc32c(), &out_->buckets[b]);
        std::string().swap(delta_[b]);
        if (!s.ok()) {
          *delta_failed = true;
          return s;
        }
      } else if (crc_[b] != info.crc32c()) {
        return absl::DataLossError(absl::StrCat("bucket ", b, " fails its checksum (CRC-32C ",
                                                crc_[b], ", manifest says ", info.crc32c(), ")"));
      }
    }
    return absl::OkStatus();
  }

  int deltas() const { return deltas_; }

 private:
  enum class Kind : uint8_t { kUnknown, kWhole, kDelta };

  // The first chunk of a bucket says whether the bucket comes whole or as
  // a delta (of `delta_bytes`); every later one must agree.
  absl::Status Decide(uint64_t b, uint64_t delta_bytes) {
    const Kind kind = delta_bytes != 0 ? Kind::kDelta : Kind::kWhole;
    if (kind_[b] == Kind::kUnknown) {
      if (kind == Kind::kDelta) {
        const uint64_t size = out_->buckets[b].size();
        const uint64_t most = MostDeltaBytes(size);
        if (base_ == nullptr || delta_bytes > most) {
          return absl::DataLossError(absl::StrCat(
              "bucket ", b, " came as a delta of ", delta_bytes, " bytes",
              base_ == nullptr ? ", but this fetch named no base"
                               : absl::StrCat(", more than its ", size, " bytes need")));
        }
        delta_[b].resize(delta_bytes);
      }
      kind_[b] = kind;
    } else if (kind != kind_[b] || (kind == Kind::kDelta && delta_bytes != delta_[b].size())) {
      return absl::DataLossError(absl::StrCat(
          "bucket ", b, ": a chunk ", kind == Kind::kDelta ? "of a delta" : "of whole bytes",
          " does not continue the chunks before it"));
    }
    return absl::OkStatus();
  }

  ReceivedSnapshot* const out_;
  const ReceivedSnapshot* const base_;
  std::vector<uint64_t> received_;
  std::vector<uint32_t> crc_;
  std::vector<Kind> kind_;
  std::vector<std::string> delta_;
  int deltas_ = 0;
};

}  // namespace

SnapshotFetcher::SnapshotFetcher(std::shared_ptr<grpc::Channel> channel, uint32_t max_chunk_bytes,
                                 ReceiverMetrics& metrics)
    : channel_(std::move(channel)), max_chunk_bytes_(max_chunk_bytes), metrics_(metrics) {}

std::shared_ptr<ReceivedSnapshot> SnapshotFetcher::NewSnapshot(
    const v1::SnapshotManifest& manifest) {
  // The buffers of the last snapshot the caller released, if any: already
  // faulted in, and of the same sizes whenever the layout did not change
  // (resize() is then free).
  std::vector<std::string> reuse;
  {
    absl::MutexLock lock(&pool_->mu);
    reuse.swap(pool_->buckets);
  }
  std::shared_ptr<ReceivedSnapshot> snapshot(
      new ReceivedSnapshot, [weak = std::weak_ptr<Pool>(pool_)](ReceivedSnapshot* s) {
        if (std::shared_ptr<Pool> p = weak.lock()) {
          absl::MutexLock lock(&p->mu);
          if (p->buckets.empty()) p->buckets = std::move(s->buckets);
        }
        delete s;
      });
  snapshot->manifest = manifest;
  snapshot->buckets = std::move(reuse);
  const size_t n = static_cast<size_t>(manifest.buckets_size());
  snapshot->buckets.resize(n);
  for (size_t b = 0; b < n; ++b) {
    snapshot->buckets[b].resize(manifest.buckets(static_cast<int>(b)).size_bytes());
  }
  return snapshot;
}

const ReceivedSnapshot* SnapshotFetcher::DeltaBaseFor(const v1::SnapshotManifest& manifest,
                                                      const ReceivedSnapshot* base) {
  if (base == nullptr || !manifest.has_delta_base() || manifest.incarnation().empty() ||
      base->version() != manifest.delta_base_version() ||
      base->manifest.incarnation() != manifest.incarnation() ||
      base->manifest.buckets_size() != manifest.buckets_size() ||
      base->buckets.size() != static_cast<size_t>(manifest.buckets_size())) {
    return nullptr;
  }
  for (int b = 0; b < manifest.buckets_size(); ++b) {
    if (base->buckets[static_cast<size_t>(b)].size() != manifest.buckets(b).size_bytes()) {
      return nullptr;
    }
  }
  return base;
}

absl::Status SnapshotFetcher::RebuildBucket(const ReceivedSnapshot& base, int b,
                                            absl::string_view delta, uint32_t want_crc,
                                            std::string* out) {
  uint32_t crc = 0;
  const absl::Status s = ApplyDeltaPieces(
      reinterpret_cast<const uint8_t*>(base.buckets[static_cast<size_t>(b)].data()), delta,
      reinterpret_cast<uint8_t*>(out->data()), out->size(), DeltaApplyThreads(), &crc);
  if (!s.ok()) {
    return absl::DataLossError(
        absl::StrCat("bucket ", b, "'s delta against version ", base.version(), ": ", s.message()));
  }
  if (crc != want_crc) {
    return absl::DataLossError(
        absl::StrCat("bucket ", b, " rebuilt from its delta against version ", base.version(),
                     " fails its checksum (CRC-32C ", crc, ", manifest says ", want_crc, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> SnapshotFetcher::Fetch(
    grpc::ClientContext* ctx, const std::string& session_id, const v1::SnapshotManifest& manifest,
    const std::string& model_signature, const ReceivedSnapshot* base, bool* delta_failed) {
  const uint64_t version = manifest.version();
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid manifest: ", s.message()));
  }
  if (manifest.model_signature() != model_signature) {
    return absl::FailedPreconditionError(absl::StrCat("manifest has model signature ",
                                                      manifest.model_signature(),
                                                      "; this receiver's is ", model_signature));
  }
  base = DeltaBaseFor(manifest, base);
  std::shared_ptr<ReceivedSnapshot> snapshot = NewSnapshot(manifest);
  Reception reception(snapshot.get(), base);

  v1::FetchSnapshotRequest request;
  request.set_session_id(session_id);
  request.set_version(version);
  request.set_incarnation(manifest.incarnation());  // not another learner process's
  request.set_max_chunk_bytes(max_chunk_bytes_);
  if (base != nullptr) {
    request.set_has_base(true);
    request.set_base_version(base->version());
  }
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), method_, ctx,
                                                                    request));
  grpc::ByteBuffer message;
  std::vector<grpc::Slice> slices;
  absl::Status bad;
  while (reader->Read(&message)) {
    slices.clear();
    absl::StatusOr<ChunkView> chunk =
        message.Dump(&slices).ok() ? ParseChunk(slices) : absl::DataLossError("unreadable chunk");
    if (chunk.ok()) metrics_.fetch_bytes.Increment(static_cast<double>(chunk->size));
    bad = chunk.ok() ? reception.Take(slices, *chunk, version) : chunk.status();
    if (!bad.ok()) {
      ctx->TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!bad.ok()) return bad;
  if (!status.ok()) return FromGrpcStatus(status, "FetchSnapshot");
  ASYMPO_RETURN_IF_ERROR(reception.Finish(manifest, delta_failed));
  if (reception.deltas() > 0) metrics_.delta_versions.Increment();
  return snapshot;
}

GrpcSnapshotTransport::GrpcSnapshotTransport(SnapshotFetcher* fetcher, std::string session_id,
                                             std::string model_signature,
                                             absl::Duration fetch_timeout,
                                             prometheus::Counter& delta_fallbacks)
    : fetcher_(fetcher),
      session_id_(std::move(session_id)),
      model_signature_(std::move(model_signature)),
      fetch_timeout_(fetch_timeout),
      delta_fallbacks_(delta_fallbacks) {}

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> GrpcSnapshotTransport::Receive(
    const v1::SnapshotAnnouncement& announcement, bool wanted,
    const std::shared_ptr<const ReceivedSnapshot>& base) {
  if (!wanted) return nullptr;
  const v1::SnapshotManifest& manifest = announcement.manifest();
  bool delta_failed = false;
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> snapshot =
      FetchOnce(manifest, base.get(), &delta_failed);
  if (snapshot.ok() || !delta_failed) return snapshot;
  delta_fallbacks_.Increment();
  LOG(WARNING) << "version " << manifest.version() << ": " << snapshot.status().message()
               << "; fetching it whole";
  return FetchOnce(manifest, nullptr, &delta_failed);
}

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> GrpcSnapshotTransport::FetchOnce(
    const v1::SnapshotManifest& manifest, const ReceivedSnapshot* base, bool* delta_failed) {
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(fetch_timeout_));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("the receiver is stopping");
    call_ = &ctx;
  }
  auto snapshot =
      fetcher_->Fetch(&ctx, session_id_, manifest, model_signature_, base, delta_failed);
  absl::MutexLock lock(&mu_);
  call_ = nullptr;
  return snapshot;
}

void GrpcSnapshotTransport::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (call_ != nullptr) call_->TryCancel();
}

}  // namespace asympo::broadcast
