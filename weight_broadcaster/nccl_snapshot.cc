#include "weight_broadcaster/nccl_snapshot.h"

#include <cstdint>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "weight_broadcaster/snapshot_delta.h"
#include "weight_broadcaster/snapshot_fetch.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast {

namespace {

// The announcement's nccl_delta_bytes, checked against its manifest before
// any collective: one entry per bucket, a delta base, and no delta longer
// than its bucket can need (MostDeltaBytes).
absl::Status ValidateNcclDeltas(const v1::SnapshotAnnouncement& a) {
  const v1::SnapshotManifest& m = a.manifest();
  if (a.nccl_delta_bytes_size() == 0) return absl::OkStatus();
  if (a.nccl_delta_bytes_size() != m.buckets_size()) {
    return absl::InvalidArgumentError(absl::StrCat("nccl_delta_bytes has ",
                                                   a.nccl_delta_bytes_size(), " entries for ",
                                                   m.buckets_size(), " buckets"));
  }
  if (!m.has_delta_base()) {
    return absl::InvalidArgumentError("nccl_delta_bytes for a version without a delta base");
  }
  for (int b = 0; b < m.buckets_size(); ++b) {
    const uint64_t d = a.nccl_delta_bytes(b), size = m.buckets(b).size_bytes();
    if (d > 0 && (size == 0 || d > MostDeltaBytes(size))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", b, "'s delta of ", d, " bytes exceeds what its ", size, " bytes can need"));
    }
  }
  return absl::OkStatus();
}

uint64_t DeltaBytesOf(const v1::SnapshotAnnouncement& a, int b) {
  return a.nccl_delta_bytes_size() == 0 ? 0 : a.nccl_delta_bytes(b);
}

}  // namespace

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> ReceiveSnapshotOverNccl(
    NcclBroadcaster& comm, const v1::SnapshotAnnouncement& announcement,
    const std::string& model_signature, const ReceivedSnapshot* base, bool* delta_failed) {
  const v1::SnapshotManifest& manifest = announcement.manifest();
  // The bucket and delta sizes must be trusted before taking part at all.
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) return s;
  if (absl::Status s = ValidateNcclDeltas(announcement); !s.ok()) return s;
  auto snapshot = std::make_shared<ReceivedSnapshot>();
  snapshot->manifest = manifest;
  snapshot->buckets.resize(static_cast<size_t>(manifest.buckets_size()));
  std::vector<std::string> deltas(static_cast<size_t>(manifest.buckets_size()));
  for (int b = 0; b < manifest.buckets_size(); ++b) {
    std::string& bucket = snapshot->buckets[static_cast<size_t>(b)];
    bucket.resize(manifest.buckets(b).size_bytes());
    if (bucket.empty()) continue;  // every rank skips empty buckets
    std::string& delta = deltas[static_cast<size_t>(b)];
    delta.resize(DeltaBytesOf(announcement, b));
    std::string& into = delta.empty() ? bucket : delta;
    if (absl::Status s = comm.Broadcast(into.data(), into.size()); !s.ok()) return s;
  }
  // Checked only now: the broadcasts happen whatever the manifest says, or
  // this rank would fall out of step with the others.
  if (manifest.model_signature() != model_signature) {
    return absl::FailedPreconditionError(absl::StrCat("manifest has model signature ",
                                                      manifest.model_signature(),
                                                      "; this receiver's is ", model_signature));
  }
  base = SnapshotFetcher::DeltaBaseFor(manifest, base);
  for (int b = 0; b < manifest.buckets_size(); ++b) {
    const std::string& delta = deltas[static_cast<size_t>(b)];
    if (!delta.empty()) {
      absl::Status s =
          base == nullptr
              ? absl::FailedPreconditionError(absl::StrCat(
                    "bucket ", b, " came as a delta against version ",
                    manifest.delta_base_version(), ", which this receiver does not hold"))
              : SnapshotFetcher::RebuildBucket(*base, b, delta, manifest.buckets(b).crc32c(),
                                               &snapshot->buckets[static_cast<size_t>(b)]);
      if (!s.ok()) {
        *delta_failed = true;
        return s;
      }
      continue;
    }
    const std::string& bucket = snapshot->buckets[static_cast<size_t>(b)];
    if (Crc32c(bucket.data(), bucket.size()) != manifest.buckets(b).crc32c()) {
      return absl::DataLossError(
          absl::StrCat("bucket ", b, " of version ", manifest.version(), " fails its checksum"));
    }
  }
  return snapshot;
}

absl::StatusOr<std::unique_ptr<NcclSnapshotTransport>> NcclSnapshotTransport::Join(
    const v1::RegisterResponse& registration, int device, const NcclBroadcasterOptions& options,
    std::string model_signature, prometheus::Counter& delta_versions) {
  LOG(INFO) << "joining the learner's NCCL communicator as rank " << registration.nccl_rank()
            << " of " << registration.nccl_world_size();
  absl::StatusOr<std::unique_ptr<NcclBroadcaster>> comm =
      NcclBroadcaster::Create(registration.nccl_unique_id(), registration.nccl_rank(),
                              registration.nccl_world_size(), device, options);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<NcclSnapshotTransport>(
      new NcclSnapshotTransport(*std::move(comm), std::move(model_signature), delta_versions));
}

NcclSnapshotTransport::NcclSnapshotTransport(std::unique_ptr<NcclBroadcaster> comm,
                                             std::string model_signature,
                                             prometheus::Counter& delta_versions)
    : comm_(std::move(comm)),
      model_signature_(std::move(model_signature)),
      delta_versions_(delta_versions) {}

NcclSnapshotTransport::~NcclSnapshotTransport() = default;

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> NcclSnapshotTransport::Receive(
    const v1::SnapshotAnnouncement& announcement, bool wanted,
    const std::shared_ptr<const ReceivedSnapshot>& base) {
  bool delta_failed = false;
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> received =
      ReceiveSnapshotOverNccl(*comm_, announcement, model_signature_, base.get(), &delta_failed);
  delta_failed_ = delta_failed;
  if (received.ok() && announcement.nccl_delta_bytes_size() > 0) delta_versions_.Increment();
  if (!received.ok()) {
    // No collective was issued for a bad manifest: this rank is now out of
    // step with the others and cannot take part again.
    if (received.status().code() == absl::StatusCode::kInvalidArgument) out_of_step_ = true;
    return received.status();
  }
  if (!wanted) return nullptr;
  return received;
}

bool NcclSnapshotTransport::usable() const { return comm_->healthy() && !out_of_step_.load(); }

void NcclSnapshotTransport::Cancel() { comm_->Cancel(); }

}  // namespace asympo::broadcast
