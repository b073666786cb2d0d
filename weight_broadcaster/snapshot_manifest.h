// Snapshot manifests: how a policy snapshot's tensors are packed into large
// buckets for transfer (docs/protocol.md, "Weight broadcast").
//
// The sender plans the layout once per model (PlanSnapshot), fills the
// buckets, and stamps each bucket's CRC-32C; the receiver checks the manifest
// (ValidateManifest) before it trusts any offset in it. Pure functions,
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"

namespace asympo::broadcast {

// One tensor to be packed.
struct TensorSpec {
  std::string name;
  v1::DType dtype = v1::DTYPE_F32;
  std::vector<int64_t> shape;
};

// Bytes per element; 0 for DTYPE_UNSPECIFIED or unknown values.
size_t DTypeSize(v1::DType dtype);

// The most padding a tensor may have before it in its bucket: the largest
// alignment PlanSnapshot takes, and what ValidateManifest allows.
inline constexpr uint64_t kMaxAlignmentGap = 4096;

struct PackingOptions {
  // Target bucket size. Tensors are packed in order into the current bucket
  // until the next would overflow it; a tensor larger than this gets a
  // bucket of its own (tensors are never split).
  uint64_t bucket_bytes = 256ull << 20;
  // Byte alignment of every tensor inside its bucket (a power of two, at
  // most kMaxAlignmentGap).
  uint64_t alignment = 64;
};

// Assigns each tensor a bucket and an aligned offset, in the given order.
// Bucket checksums are left 0 for the sender to fill. INVALID_ARGUMENT for an
// empty or duplicate name, a negative dimension, an unknown dtype, or bad
// options.
absl::StatusOr<v1::SnapshotManifest> PlanSnapshot(const std::vector<TensorSpec>& tensors,
                                                  uint64_t version,
                                                  const PackingOptions& options = {});

// Checks a manifest received from a peer: dense bucket indices, sizes equal
// to shape x dtype, every tensor inside its bucket, no two tensors
// overlapping, total_bytes consistent. Errors name the tensor or bucket.
absl::Status ValidateManifest(const v1::SnapshotManifest& manifest);

// A short stable string identifying names, dtypes and shapes (order
// included), so that a receiver never loads weights of another architecture.
std::string ModelSignature(const std::vector<TensorSpec>& tensors);

}  // namespace asympo::broadcast
