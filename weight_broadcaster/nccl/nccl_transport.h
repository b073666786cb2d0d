// The NCCL transport of the weight broadcaster (docs/protocol.md, "Weight broadcast"): moves
// snapshot buckets, which live in host memory, from the learner (rank 0) to
// every rollout daemon over one NCCL communicator.
//
// A bucket is cut into pieces that travel through a bounded device staging
// buffer (two slots, so that one piece is copied while the previous one is
// broadcast): host -> device on the root, ncclBroadcast, device -> host on
// the other ranks. Buckets of any size work with a few hundred MiB of device
// memory. The piece size is the root's: Create() ends with a handshake
// broadcast that tells every rank the root's piece size (every rank must
// issue identical collectives) and proves the communicator moves bytes.
//
// Every wait (init, handshake, each piece) is a poll with a watchdog
// deadline. On timeout, an asynchronous NCCL error (a peer died) or
// Cancel(), the communicator is aborted (ncclCommAbort), marked dead, and
// the call returns an error naming the operation, the rank and the time
// spent; every later call fails at once with FAILED_PRECONDITION. A dead
// broadcaster is not repaired: the owner builds a new communicator (new
// unique id, every rank re-registers).
//
// How the sender and the receiver use it (the protocol is gRPC's, see
// docs/protocol.md; only the bytes move over NCCL):
//  - The learner is configured for N - 1 NCCL receivers. It makes one id
//    (NewNcclUniqueId) and hands it out in RegisterResponse.nccl_unique_id
//    with nccl_rank 1..N-1 in registration order and nccl_world_size N. It
//    calls Create(id, 0, N, ...) on a thread of its own: Create returns only
//    when all N ranks have joined (or init_timeout passes).
//  - A receiver calls Create(id, its rank, N, ...) after Register.
//  - For each version the learner announces the manifest (Subscribe), then
//    calls Broadcast(bucket i) for every bucket in manifest order. Every
//    receiver, for every announcement, allocates its second buffer and calls
//    Broadcast(buffer i, manifest size of bucket i) in the same order; no
//    rank may skip a version, or every rank's next wait times out. Zero-size
//    buckets are skipped by all ranks alike (no collective is issued).
//  - After its broadcasts a receiver verifies each bucket's CRC-32C exactly
//    as on the gRPC path; a mismatch keeps the old weights and is reported
//    with ReportVersion, while the communicator stays usable.
//  - Any error from this class leaves the communicator dead on that rank;
//    the other ranks see their next wait time out or an async error. The
//    learner then falls back to gRPC or starts a new communicator.
//
// Thread-compatible: one thread at a time calls Broadcast (calls from
// several threads are serialized). Cancel(), healthy() and the accessors
// may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "weight_broadcaster/nccl/nccl_abi.h"
#include "weight_broadcaster/nccl/nccl_loader.h"

namespace asympo::broadcast {

struct NcclBroadcasterOptions {
  // Where libnccl and libcudart are (see NcclLoadOptions).
  NcclLoadOptions load;
  // Communicator initialisation, which waits for every rank to join.
  absl::Duration init_timeout = absl::Minutes(2);
  // The watchdog: the longest any single wait (the handshake, one piece of
  // a bucket, the final drain) may take before the communicator is aborted.
  // A piece is at most staging_bytes / 2, so this bounds a stall, not the
  // time of a whole bucket.
  absl::Duration timeout = absl::Seconds(60);
  // Device memory for the pipeline on the root: two slots of
  // staging_bytes / 2 (rounded down to 4 KiB). Receivers allocate twice the
  // root's piece size, whatever they ask for here. At least 8 KiB.
  uint64_t staging_bytes = 128ull << 20;
  // How often a wait polls. Smaller costs CPU, larger adds latency per piece.
  absl::Duration poll_interval = absl::Microseconds(50);
  // False forces the blocking init on a helper thread, the path taken with
  // NCCL < 2.14 (for tests, or to work around a non-blocking init problem).
  bool nonblocking_init = true;
};

class NcclBroadcaster {
 public:
  // Joins the communicator named by `unique_id` (128 bytes, from
  // NewNcclUniqueId on rank 0) as `rank` of `world_size`, on CUDA device
  // `device`. Uses a non-blocking communicator (ncclCommInitRankConfig,
  // NCCL >= 2.14) polled under init_timeout; with older NCCL (or
  // nonblocking_init false) the blocking init runs on a helper thread that
  // is abandoned on timeout (it aborts its communicator whenever the call
  // returns). Errors: INVALID_ARGUMENT (bad id, rank, world size, device or
  // options), the loader's errors, FAILED_PRECONDITION (no CUDA device),
  // DEADLINE_EXCEEDED (not every rank joined in time), UNAVAILABLE /
  // INTERNAL (NCCL or CUDA failed; the message carries their error text).
  static absl::StatusOr<std::unique_ptr<NcclBroadcaster>> Create(
      absl::string_view unique_id, int rank, int world_size, int device,
      const NcclBroadcasterOptions& options = {});

  // Aborts the communicator (every operation has completed or failed by
  // then, so nothing is lost, and abort never waits on a peer) and frees
  // the device buffers.
  ~NcclBroadcaster();

  NcclBroadcaster(const NcclBroadcaster&) = delete;
  NcclBroadcaster& operator=(const NcclBroadcaster&) = delete;

  // Collective: on rank 0 sends the n bytes at `host_bytes`; on the other
  // ranks overwrites the n bytes at `host_bytes` with rank 0's. Every rank
  // must call it with the same n. Returns once this rank's part is done
  // (on a receiver: the bytes are in `host_bytes`). Any host memory works;
  // pinned memory is faster.
  absl::Status Broadcast(void* host_bytes, size_t n);

  // Rank 0 only: broadcasts `src` like Broadcast and also copies what the
  // collective delivered on rank 0 into `readback` (n bytes), so that the
  // whole data path (host -> device -> NCCL -> device -> host) can be
  // checked on one GPU with world size 1. FAILED_PRECONDITION on other ranks.
  absl::Status BroadcastWithReadback(const void* src, void* readback, size_t n);

  // Rank 0 only: broadcasts n bytes that are already in device memory (on
  // this broadcaster's device), straight from there: no host round trip and
  // no staging slot. The other ranks call Broadcast as usual. The bytes must
  // stay unchanged until this returns. FAILED_PRECONDITION on other ranks.
  absl::Status BroadcastFromDevice(const void* device_bytes, size_t n);

  // Aborts the operation in progress (it returns CANCELLED) or, when idle,
  // makes the next one fail. Any thread.
  void Cancel();

  // False once the communicator was aborted.
  bool healthy() const { return !dead_.load(std::memory_order_acquire); }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Bytes per collective (the root's choice, learned in the handshake).
  uint64_t piece_bytes() const { return piece_bytes_; }
  // Whether init used a non-blocking communicator.
  bool nonblocking() const { return nonblocking_; }
  const NcclApi& api() const { return *api_; }

 private:
  struct Slot;

  NcclBroadcaster(const NcclApi* api, int rank, int world_size, int device,
                  const NcclBroadcasterOptions& options);

  absl::Status Init(const nccl::UniqueId& id);
  absl::Status InitBlockingOnHelperThread(const nccl::UniqueId& id);
  absl::Status Handshake();
  absl::Status AllocateSlots(uint64_t piece_bytes, bool readback);
  absl::Status Run(const void* src, void* dst, size_t n, absl::string_view what,
                   bool src_on_device = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Run's parts: the pieces of one operation, enqueueing piece i, copying a
  // broadcast piece out, and a watched wait for a CUDA event.
  struct Pipeline;
  absl::Status IssuePiece(const Pipeline& p, size_t i);
  absl::Status DrainPiece(const Pipeline& p, size_t i);
  absl::Status WaitEvent(nccl::Event event, const std::string& label);

  // Polls `ready` (true: done) every poll_interval until it is done, it
  // fails, the communicator reports an async error, Cancel() is called, or
  // `timeout` passes. Every failure goes through Fail().
  template <typename ReadyFn>
  absl::Status Wait(absl::string_view what, absl::Duration timeout, ReadyFn ready);
  // Waits for a non-blocking communicator to finish the last NCCL call.
  absl::Status WaitCommReady(absl::string_view what);
  // Checks an NCCL call's result; ncclInProgress is waited out.
  absl::Status CheckNccl(nccl::Result result, absl::string_view what);
  absl::Status CheckCuda(nccl::CudaError error, absl::string_view what);
  // Aborts the communicator, marks it dead, logs, and returns `status`.
  absl::Status Fail(absl::Status status);
  absl::Status DeadError() const;
  std::string Where() const;  // "rank 1 of 4"

  const NcclApi* const api_;
  const int rank_;
  const int world_size_;
  const int device_;
  const NcclBroadcasterOptions options_;

  nccl::Comm comm_ = nullptr;
  bool nonblocking_ = false;
  uint64_t piece_bytes_ = 0;
  nccl::Stream copy_stream_ = nullptr;  // host <-> device copies
  nccl::Stream nccl_stream_ = nullptr;  // the collectives
  void* control_ = nullptr;             // the handshake's device buffer
  std::unique_ptr<Slot[]> slots_;       // two
  bool slots_have_readback_ = false;

  absl::Mutex op_mu_;  // one operation at a time
  std::atomic<bool> dead_{false};
  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex error_mu_;
  absl::Status dead_reason_ ABSL_GUARDED_BY(error_mu_);
};

// A fresh ncclUniqueId as 128 bytes, for RegisterResponse.nccl_unique_id.
// Called on the learner (rank 0): NCCL starts its bootstrap listener on
// this host, which every rank then contacts during Create.
absl::StatusOr<std::string> NewNcclUniqueId(const NcclLoadOptions& options = {});

}  // namespace asympo::broadcast
