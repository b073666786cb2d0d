// How the bytes of an announced snapshot reach a weight receiver, behind one
// small interface with two implementations: a gRPC fetch
// (snapshot_fetch.h) and the NCCL broadcast (nccl_snapshot.h). The
// WeightReceiver decides which versions it wants and what a failure means;
// a transport only moves and verifies bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "asympo/v1/weight_broadcast.pb.h"

namespace asympo::broadcast {

// A complete, verified snapshot in host memory.
struct ReceivedSnapshot {
  v1::SnapshotManifest manifest;
  std::vector<std::string> buckets;  // buckets[i] holds bucket i's bytes

  uint64_t version() const { return manifest.version(); }
  // The bytes of tensor `entry` (an entry of manifest.tensors()).
  std::string_view TensorBytes(const v1::TensorEntry& entry) const;
};

// One receiver's transport. Receive runs on the receiver's worker thread,
// once per announcement, in announcement order; Cancel may come from any
// thread.
class SnapshotTransport {
 public:
  virtual ~SnapshotTransport() = default;

  // "grpc" or "nccl", for logs.
  virtual const char* name() const = 0;

  // Receives the version `announcement`'s manifest describes and checks it
  // (the model signature, every bucket's CRC-32C). With wanted false the
  // receiver does not need this version: a transport that must take part
  // anyway (every NCCL rank joins every broadcast) does so and returns
  // null, the others return null at once. Errors name the version or the
  // bucket; after one, usable() says whether the next version may come
  // this way. `base` (may be null) is the newest verified snapshot the
  // receiver holds: the version is rebuilt from it where it comes as a
  // delta from it (a gRPC fetch that names it; an NCCL broadcast of
  // nccl_delta_bytes).
  virtual absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> Receive(
      const v1::SnapshotAnnouncement& announcement, bool wanted,
      const std::shared_ptr<const ReceivedSnapshot>& base) = 0;

  // False once this transport cannot receive again (an aborted NCCL
  // communicator); the receiver then drops it for the gRPC fetch.
  virtual bool usable() const = 0;

  // Makes a Receive in progress return promptly with an error, and every
  // later one too. Any thread.
  virtual void Cancel() = 0;
};

}  // namespace asympo::broadcast
