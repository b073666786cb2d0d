// libFuzzer target: ValidateManifest (weight_broadcaster/snapshot_manifest.h)
// on a SnapshotManifest parsed from the input, as a rollout daemon receives
// it from the learner before it sizes its buckets. Beyond not crashing, a
// manifest it accepts must let the receiver trust every size and offset:
// total_bytes is the true sum of the bucket sizes, and every tensor lies
// inside its bucket, checked here in 128-bit arithmetic.
#include <cstddef>
#include <cstdint>

#include "asympo/v1/weight_broadcast.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace {

using Uint128 = unsigned __int128;

void CheckAccepted(const asympo::v1::SnapshotManifest& m) {
  Uint128 total = 0;
  for (int b = 0; b < m.buckets_size(); ++b) {
    ASYMPO_FUZZ_CHECK(m.buckets(b).index() == static_cast<uint32_t>(b));
    total += m.buckets(b).size_bytes();
  }
  ASYMPO_FUZZ_CHECK(total == m.total_bytes());
  for (const asympo::v1::TensorEntry& e : m.tensors()) {
    ASYMPO_FUZZ_CHECK(e.bucket() < static_cast<uint32_t>(m.buckets_size()));
    const Uint128 end = Uint128{e.offset()} + e.size_bytes();
    ASYMPO_FUZZ_CHECK(end <= m.buckets(static_cast<int>(e.bucket())).size_bytes());
    // The size is dtype x shape: 0 with a zero dimension; otherwise the
    // product only grows, so it stops once past size_bytes (before 128 bits
    // could overflow).
    Uint128 bytes = asympo::broadcast::DTypeSize(e.dtype());
    ASYMPO_FUZZ_CHECK(bytes > 0);
    for (int64_t d : e.shape()) {
      ASYMPO_FUZZ_CHECK(d >= 0);
      if (d == 0) bytes = 0;
    }
    for (int64_t d : e.shape()) {
      if (bytes > e.size_bytes()) break;
      bytes *= static_cast<uint64_t>(d);
    }
    ASYMPO_FUZZ_CHECK(bytes == e.size_bytes());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  asympo::v1::SnapshotManifest manifest;
  if (!manifest.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::Status status = asympo::broadcast::ValidateManifest(manifest);
  if (status.ok()) {
    CheckAccepted(manifest);
  } else {
    ASYMPO_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
