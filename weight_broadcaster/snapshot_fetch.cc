#include "weight_broadcaster/snapshot_fetch.h"

#include <utility>

#include <grpcpp/support/sync_stream.h>

#include "absl/strings/str_cat.h"
#include "asympo/v1/weight_broadcast.grpc.pb.h"  // protobuf serialization for the request
#include "common/grpc_status.h"
#include "weight_broadcaster/snapshot_manifest.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {

SnapshotFetcher::SnapshotFetcher(std::shared_ptr<grpc::Channel> channel, uint32_t max_chunk_bytes,
                                 prometheus::Counter& bytes)
    : channel_(std::move(channel)), max_chunk_bytes_(max_chunk_bytes), bytes_(bytes) {}

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

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> SnapshotFetcher::Fetch(
    grpc::ClientContext* ctx, const std::string& session_id, const v1::SnapshotManifest& manifest,
    const std::string& model_signature) {
  const uint64_t version = manifest.version();
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid manifest: ", s.message()));
  }
  if (manifest.model_signature() != model_signature) {
    return absl::FailedPreconditionError(absl::StrCat("manifest has model signature ",
                                                      manifest.model_signature(),
                                                      "; this receiver's is ", model_signature));
  }
  std::shared_ptr<ReceivedSnapshot> snapshot = NewSnapshot(manifest);
  const size_t n = snapshot->buckets.size();
  std::vector<uint64_t> received(n, 0);
  std::vector<uint32_t> crc(n, 0);

  v1::FetchSnapshotRequest request;
  request.set_session_id(session_id);
  request.set_version(version);
  request.set_incarnation(manifest.incarnation());  // not another learner process's
  request.set_max_chunk_bytes(max_chunk_bytes_);
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
    if (!chunk.ok()) {
      bad = chunk.status();
    } else {
      bytes_.Increment(static_cast<double>(chunk->size));
      const uint64_t b = chunk->bucket;
      if (chunk->version != version) {
        bad = absl::DataLossError(absl::StrCat("chunk of version ", chunk->version));
      } else if (b >= n) {
        bad = absl::DataLossError(absl::StrCat("chunk for bucket ", b, " of ", n));
      } else if (chunk->offset != received[b] ||
                 chunk->size > snapshot->buckets[b].size() - received[b]) {
        bad = absl::DataLossError(absl::StrCat("bucket ", b, ": chunk at offset ", chunk->offset,
                                               " of ", chunk->size, " bytes after ", received[b],
                                               " of ", snapshot->buckets[b].size(), " bytes"));
      } else {
        CopyChunkData(slices, *chunk, snapshot->buckets[b].data() + received[b], &crc[b]);
        received[b] += chunk->size;
      }
    }
    if (!bad.ok()) {
      ctx->TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!bad.ok()) return bad;
  if (!status.ok()) return FromGrpcStatus(status, "FetchSnapshot");
  for (size_t b = 0; b < n; ++b) {
    const v1::BucketInfo& info = manifest.buckets(static_cast<int>(b));
    if (received[b] != info.size_bytes()) {
      return absl::DataLossError(absl::StrCat("bucket ", b, " is incomplete: ", received[b], " of ",
                                              info.size_bytes(), " bytes"));
    }
    if (crc[b] != info.crc32c()) {
      return absl::DataLossError(absl::StrCat("bucket ", b, " fails its checksum (CRC-32C ", crc[b],
                                              ", manifest says ", info.crc32c(), ")"));
    }
  }
  return snapshot;
}

GrpcSnapshotTransport::GrpcSnapshotTransport(SnapshotFetcher* fetcher, std::string session_id,
                                             std::string model_signature,
                                             absl::Duration fetch_timeout)
    : fetcher_(fetcher),
      session_id_(std::move(session_id)),
      model_signature_(std::move(model_signature)),
      fetch_timeout_(fetch_timeout) {}

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> GrpcSnapshotTransport::Receive(
    const v1::SnapshotManifest& manifest, bool wanted) {
  if (!wanted) return nullptr;
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(fetch_timeout_));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("the receiver is stopping");
    call_ = &ctx;
  }
  auto snapshot = fetcher_->Fetch(&ctx, session_id_, manifest, model_signature_);
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
