#include "weight_broadcaster/nccl_snapshot.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "weight_broadcaster/crc32c.h"
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
      return absl::DataLossError(absl::StrCat("bucket ", b, " of version ", manifest.version(),
                                              " fails its checksum"));
    }
  }
  return snapshot;
}

}  // namespace asympo::broadcast
