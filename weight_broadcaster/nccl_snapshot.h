// The receiving end of one version on the NCCL transport (DESIGN.md
// section 5): the bucket broadcasts a non-root rank takes part in after an
// announcement, and the same checks as a gRPC fetch. Built only with
// ASYMPO_NCCL. Thread-compatible (as NcclBroadcaster::Broadcast).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/nccl_transport.h"

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

}  // namespace asympo::broadcast
