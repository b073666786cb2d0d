// One snapshot transfer on the receiver side: FetchSnapshot read raw, each
// chunk's data copied from gRPC's receive slices straight into its bucket
// (wire_format.h) and checksummed on the way, every byte of every bucket
// accounted for, every bucket's CRC-32C checked.
//
// Delta versions (docs/protocol.md, "Delta versions"): given the snapshot
// the receiver holds, when the manifest's delta is from that version of the
// same incarnation, the fetch names it as its base; buckets that come as
// deltas are rebuilt from the base's and checked against the same CRC-32C.
// A delta that does not rebuild the version is refetched whole at once
// (counted).
//
// Buckets are recycled: when the caller drops a snapshot this fetcher
// produced, its buffers go to the next Fetch (one snapshot's worth is kept),
// so that a steady stream of versions costs no page faults or zeroing.
// Fetch may run on one thread at a time; releasing snapshots is thread-safe.
//
// GrpcSnapshotTransport is the SnapshotTransport of one receiver session on
// top of a fetcher that outlives the sessions (and keeps its buffers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "weight_broadcaster/broadcast_metrics.h"
#include "weight_broadcaster/snapshot_transport.h"

namespace asympo::broadcast {

class SnapshotFetcher {
 public:
  // `metrics` (fetch_bytes, delta_versions) must outlive the fetcher.
  SnapshotFetcher(std::shared_ptr<grpc::Channel> channel, uint32_t max_chunk_bytes,
                  ReceiverMetrics& metrics);

  // Fetches manifest.version() under `session_id` on `ctx` (whose deadline
  // and cancellation are the caller's), as a delta against `base` when the
  // manifest's delta is from it (DeltaBaseFor). Errors: the manifest's own
  // (INVALID_ARGUMENT from ValidateManifest, FAILED_PRECONDITION for another
  // model signature than `model_signature`), the call's status (NOT_FOUND
  // when the sender no longer holds the version), DATA_LOSS for a chunk of
  // another version, outside its bucket or out of order, a bucket left
  // incomplete, or a checksum mismatch. Messages name the bucket.
  // `*delta_failed` is set when a bucket's delta did not rebuild it (the
  // version may then be fetched whole).
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> Fetch(
      grpc::ClientContext* ctx, const std::string& session_id, const v1::SnapshotManifest& manifest,
      const std::string& model_signature, const ReceivedSnapshot* base, bool* delta_failed);

  // `base` when `manifest`'s delta is from it: its version, its incarnation
  // (not empty) and its buckets' sizes; else null.
  static const ReceivedSnapshot* DeltaBaseFor(const v1::SnapshotManifest& manifest,
                                              const ReceivedSnapshot* base);

  // Bucket b rebuilt into `*out` (already its size) from `delta` and bucket
  // b of `base`, and checked against `want_crc`: the one rebuild of a gRPC
  // fetch and an NCCL broadcast. DATA_LOSS naming the bucket and the base
  // when the delta does not apply or the result fails its CRC-32C.
  static absl::Status RebuildBucket(const ReceivedSnapshot& base, int b, absl::string_view delta,
                                    uint32_t want_crc, std::string* out);

 private:
  struct Pool {
    absl::Mutex mu;
    std::vector<std::string> buckets ABSL_GUARDED_BY(mu);
  };

  // A snapshot with buckets sized for `manifest`, on recycled buffers.
  std::shared_ptr<ReceivedSnapshot> NewSnapshot(const v1::SnapshotManifest& manifest);

  const std::shared_ptr<grpc::Channel> channel_;
  const uint32_t max_chunk_bytes_;
  ReceiverMetrics& metrics_;
  const std::shared_ptr<Pool> pool_ = std::make_shared<Pool>();
  // FetchSnapshot called raw, with a method object built as the generated
  // stub builds its own.
  const grpc::internal::RpcMethod method_{"/asympo.v1.WeightBroadcast/FetchSnapshot",
                                          grpc::internal::RpcMethod::SERVER_STREAMING};
};

// Fetches each wanted version over gRPC (FetchSnapshot) under one session.
class GrpcSnapshotTransport final : public SnapshotTransport {
 public:
  // `fetcher` must outlive the transport. A fetch that takes longer than
  // `fetch_timeout` fails with DEADLINE_EXCEEDED.
  GrpcSnapshotTransport(SnapshotFetcher* fetcher, std::string session_id,
                        std::string model_signature, absl::Duration fetch_timeout,
                        prometheus::Counter& delta_fallbacks);

  const char* name() const override { return "grpc"; }
  // Unwanted versions are not fetched. Errors as SnapshotFetcher::Fetch;
  // CANCELLED after Cancel(). A delta that does not rebuild the version is
  // followed at once by a fetch of the whole version (counted in
  // delta_fallbacks).
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> Receive(
      const v1::SnapshotAnnouncement& announcement, bool wanted,
      const std::shared_ptr<const ReceivedSnapshot>& base) override;
  // A failed fetch does not hurt the next one.
  bool usable() const override { return true; }
  void Cancel() override;

 private:
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> FetchOnce(const v1::SnapshotManifest& manifest,
                                                              const ReceivedSnapshot* base,
                                                              bool* delta_failed);

  SnapshotFetcher* const fetcher_;
  const std::string session_id_;
  const std::string model_signature_;
  const absl::Duration fetch_timeout_;
  prometheus::Counter& delta_fallbacks_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace asympo::broadcast
