// The receiving end of the NCCL transport (docs/protocol.md, "Weight broadcast"): the bucket
// broadcasts a non-root rank takes part in after each announcement, with
// the same checks as a gRPC fetch, and the SnapshotTransport that wraps
// them for the WeightReceiver. Thread-compatible (as
// NcclBroadcaster::Broadcast), except Cancel.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/nccl/nccl_transport.h"
#include "weight_broadcaster/snapshot_transport.h"

namespace asympo::broadcast {

// Receives `manifest`'s buckets from rank 0 of `comm`, one Broadcast per
// non-empty bucket in manifest order, into a new snapshot, then checks the
// model signature and every bucket's CRC-32C. Errors:
// - INVALID_ARGUMENT: the manifest does not validate (ValidateManifest); no
//   collective was issued, so `comm` is out of step with the other ranks
//   and must be dropped;
// - the broadcaster's errors (`comm` is then dead);
// - FAILED_PRECONDITION (another model signature than `model_signature`)
//   or DATA_LOSS (a checksum mismatch, naming the bucket): every broadcast
//   took place and `comm` stays usable.
absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> ReceiveSnapshotOverNccl(
    NcclBroadcaster& comm, const v1::SnapshotManifest& manifest,
    const std::string& model_signature);

// Every announced version over one communicator: unwanted versions are
// received too (every rank takes part in every broadcast) and dropped.
// Unusable once the communicator is dead or out of step.
class NcclSnapshotTransport final : public SnapshotTransport {
 public:
  // Joins the communicator the learner assigned in `registration` (its
  // nccl_unique_id, nccl_rank and nccl_world_size) on CUDA device `device`.
  // Blocks up to options.init_timeout. Errors as NcclBroadcaster::Create.
  static absl::StatusOr<std::unique_ptr<NcclSnapshotTransport>> Join(
      const v1::RegisterResponse& registration, int device, const NcclBroadcasterOptions& options,
      std::string model_signature);
  // Aborts the communicator.
  ~NcclSnapshotTransport() override;

  const char* name() const override { return "nccl"; }
  // Every version arrives whole (`base` is not used).
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> Receive(
      const v1::SnapshotManifest& manifest, bool wanted,
      const std::shared_ptr<const ReceivedSnapshot>& base) override;
  bool usable() const override;
  void Cancel() override;

 private:
  NcclSnapshotTransport(std::unique_ptr<NcclBroadcaster> comm, std::string model_signature);

  const std::unique_ptr<NcclBroadcaster> comm_;
  const std::string model_signature_;
  std::atomic<bool> out_of_step_{false};
};

}  // namespace asympo::broadcast
