#include "weight_broadcaster/nccl_snapshot.h"

#include <cstdint>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast {

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> ReceiveSnapshotOverNccl(
    NcclBroadcaster& comm, const v1::SnapshotManifest& manifest,
    const std::string& model_signature) {
  // The bucket sizes must be trusted before taking part at all.
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) return s;
  auto snapshot = std::make_shared<ReceivedSnapshot>();
  snapshot->manifest = manifest;
  snapshot->buckets.resize(static_cast<size_t>(manifest.buckets_size()));
  for (int b = 0; b < manifest.buckets_size(); ++b) {
    std::string& bucket = snapshot->buckets[static_cast<size_t>(b)];
    bucket.resize(manifest.buckets(b).size_bytes());
    if (bucket.empty()) continue;  // every rank skips empty buckets
    if (absl::Status s = comm.Broadcast(bucket.data(), bucket.size()); !s.ok()) return s;
  }
  // Checked only now: the broadcasts happen whatever the manifest says, or
  // this rank would fall out of step with the others.
  if (manifest.model_signature() != model_signature) {
    return absl::FailedPreconditionError(absl::StrCat("manifest has model signature ",
                                                      manifest.model_signature(),
                                                      "; this receiver's is ", model_signature));
  }
  for (int b = 0; b < manifest.buckets_size(); ++b) {
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
    std::string model_signature) {
  LOG(INFO) << "joining the learner's NCCL communicator as rank " << registration.nccl_rank()
            << " of " << registration.nccl_world_size();
  absl::StatusOr<std::unique_ptr<NcclBroadcaster>> comm =
      NcclBroadcaster::Create(registration.nccl_unique_id(), registration.nccl_rank(),
                              registration.nccl_world_size(), device, options);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<NcclSnapshotTransport>(
      new NcclSnapshotTransport(*std::move(comm), std::move(model_signature)));
}

NcclSnapshotTransport::NcclSnapshotTransport(std::unique_ptr<NcclBroadcaster> comm,
                                             std::string model_signature)
    : comm_(std::move(comm)), model_signature_(std::move(model_signature)) {}

NcclSnapshotTransport::~NcclSnapshotTransport() = default;

absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> NcclSnapshotTransport::Receive(
    const v1::SnapshotManifest& manifest, bool wanted,
    const std::shared_ptr<const ReceivedSnapshot>& /*base*/) {
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> received =
      ReceiveSnapshotOverNccl(*comm_, manifest, model_signature_);
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
