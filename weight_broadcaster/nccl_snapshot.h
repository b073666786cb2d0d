// The receiving end of the NCCL transport (docs/protocol.md, "Weight broadcast"): the bucket
// broadcasts a non-root rank takes part in after each announcement, with
// the same checks as a gRPC fetch, and the SnapshotTransport that wraps
// them for the WeightReceiver. Thread-compatible (as
// NcclBroadcaster::Broadcast), except Cancel.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <prometheus/counter.h>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/nccl/nccl_transport.h"
#include "weight_broadcaster/snapshot_transport.h"

namespace asympo::broadcast {

// Receives the buckets of `announcement`'s manifest from rank 0 of `comm`,
// one Broadcast per non-empty bucket in manifest order, into a new
// snapshot: the bucket itself, or its delta where the announcement's
// nccl_delta_bytes gives one. Then checks the model signature, rebuilds
// each delta bucket from `base` (when the manifest's delta is from it:
// SnapshotFetcher::DeltaBaseFor) and checks every bucket's CRC-32C.
// Errors:
// - INVALID_ARGUMENT: the manifest or its delta sizes do not validate (one
//   per bucket, a delta base, none longer than MostDeltaBytes); no
//   collective was issued, so `comm` is out of step with the other ranks
//   and must be dropped;
// - the broadcaster's errors (`comm` is then dead);
// - FAILED_PRECONDITION (another model signature than `model_signature`,
//   or a delta without the base it is from) or DATA_LOSS (a checksum
//   mismatch or a delta that does not apply, naming the bucket): every
//   broadcast took place and `comm` stays usable. `*delta_failed` is set
//   when a delta bucket could not be rebuilt: the version may then be
//   fetched whole.
absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> ReceiveSnapshotOverNccl(
    NcclBroadcaster& comm, const v1::SnapshotAnnouncement& announcement,
    const std::string& model_signature, const ReceivedSnapshot* base, bool* delta_failed);

// Every announced version over one communicator: unwanted versions are
// received too (every rank takes part in every broadcast) and dropped.
// Unusable once the communicator is dead or out of step.
class NcclSnapshotTransport final : public SnapshotTransport {
 public:
  // Joins the communicator the learner assigned in `registration` (its
  // nccl_unique_id, nccl_rank and nccl_world_size) on CUDA device `device`.
  // Blocks up to options.init_timeout. Errors as NcclBroadcaster::Create.
  // Versions rebuilt from deltas are counted in `delta_versions`, which
  // must outlive the transport.
  static absl::StatusOr<std::unique_ptr<NcclSnapshotTransport>> Join(
      const v1::RegisterResponse& registration, int device, const NcclBroadcasterOptions& options,
      std::string model_signature, prometheus::Counter& delta_versions);
  // Aborts the communicator.
  ~NcclSnapshotTransport() override;

  const char* name() const override { return "nccl"; }
  // ReceiveSnapshotOverNccl, with `base` for the versions that come as
  // deltas.
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> Receive(
      const v1::SnapshotAnnouncement& announcement, bool wanted,
      const std::shared_ptr<const ReceivedSnapshot>& base) override;
  bool usable() const override;
  void Cancel() override;
  // Whether the last Receive failed because a delta could not be rebuilt
  // (the communicator stays usable; the version may be fetched whole).
  bool delta_failed() const { return delta_failed_; }

 private:
  NcclSnapshotTransport(std::unique_ptr<NcclBroadcaster> comm, std::string model_signature,
                        prometheus::Counter& delta_versions);

  const std::unique_ptr<NcclBroadcaster> comm_;
  const std::string model_signature_;
  prometheus::Counter& delta_versions_;
  std::atomic<bool> out_of_step_{false};
  bool delta_failed_ = false;  // Receive's thread only
};

}  // namespace asympo::broadcast
