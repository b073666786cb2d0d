// The receiver side of the weight broadcaster, used by the rollout daemon.
//
// A background thread registers with the learner's WeightBroadcast service,
// subscribes to announcements and fetches each new snapshot into a second
// host buffer, checking every bucket's CRC-32C. A verified snapshot becomes
// "pending"; the rollout daemon takes it between generations (TakePending),
// loads it into its spare model and flips, then calls ReportLoaded. A failed
// or corrupt transfer never becomes pending: the old weights stay in use, the
// failure is counted and reported to the learner (ReportVersion with an
// error), and the receiver waits for the next version.
//
// Announcements that arrive during a fetch are not queued: after a fetch the
// receiver goes straight to the newest one. When the learner goes away the
// thread re-registers with exponential backoff. After every (re)registration
// the first announcement is fetched whenever its version differs from the
// one held (a learner restarted from an older checkpoint is followed back);
// later ones only when newer.
//
// Delta versions (docs/protocol.md, "Delta versions"): with `deltas` on,
// the receiver keeps the newest verified snapshot as the base of the next
// fetch, which then carries only what changed when the learner holds a
// delta from it; the version is rebuilt and checked against the same CRCs,
// and fetched whole when that fails (counted).
//
// Memory: when the daemon drops a snapshot it took, its buffers are reused
// by the next fetch (one snapshot's worth is kept), so a steady stream of
// versions costs no new memory; drop each snapshot once it is loaded. With
// deltas the base is one more snapshot's worth of host memory. gRPC's
// own receive buffers are malloc'ed per message: with glibc's default
// settings freed memory goes back to the kernel at once and every transfer
// faults it in again, which costs about a third of the throughput
// (docs/benchmarks.md, "Weight broadcast transfer"); a daemon can avoid it
// with mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD,
// 256 << 20) at start.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "common/security/tls.h"
#include "weight_broadcaster/nccl/nccl_transport.h"
#include "weight_broadcaster/snapshot_transport.h"

namespace asympo::broadcast {

struct WeightReceiverOptions {
  // The learner's gRPC address, "host:port", and how to reach it securely.
  std::string target;
  security::ClientTlsOptions tls;
  std::string receiver_id;
  // ModelSignature() of the receiver's model.
  std::string model_signature;
  // Largest chunk asked for (0: the sender's default).
  uint32_t max_chunk_bytes = 0;
  // Re-registration backoff: starts at min, doubles up to max.
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // A fetch that takes longer than this fails (and is reported).
  absl::Duration fetch_timeout = absl::Minutes(10);
  // Keep the newest verified snapshot as the base of delta versions.
  bool deltas = true;
  // NCCL (off by default; see "NCCL" in docs/protocol.md): offer
  // TRANSPORT_NCCL before gRPC. When the learner hands out a rank, the
  // receiver joins its communicator on CUDA device nccl_device after
  // subscribing (Create blocks up to nccl.init_timeout, which Stop does not
  // shorten) and then takes part in the broadcast of every announced
  // version, wanted or not. A failed broadcast is counted and reported, the
  // communicator is dropped, and that version and later ones come over gRPC.
  bool prefer_nccl = false;
  int nccl_device = 0;
  NcclBroadcasterOptions nccl;
};

class WeightReceiver {
 public:
  // Starts the background thread; never blocks on the network.
  // INVALID_ARGUMENT for an empty target, a receiver_id that is empty or over
  // 128 bytes, backoffs not 0 < min <= max, or a non-positive fetch_timeout.
  // The receiver's metrics are registered in `registry`, which must outlive
  // it.
  static absl::StatusOr<std::unique_ptr<WeightReceiver>> Start(WeightReceiverOptions options,
                                                               prometheus::Registry& registry);
  ~WeightReceiver();  // Stop()

  // The newest verified snapshot not yet taken, or null. Older pending
  // snapshots are discarded when a newer one arrives.
  std::shared_ptr<const ReceivedSnapshot> TakePending();

  // Blocks until a snapshot is pending or `timeout` passes (or Stop).
  bool WaitForPending(absl::Duration timeout);

  // The daemon now samples with `version`: reported to the learner (async)
  // and exported as the rollout weight-version metric; `load_seconds` (when
  // not negative), the time the snapshot took to load into the model, goes
  // to asympo_rollout_weight_load_seconds.
  void ReportLoaded(uint64_t version, double load_seconds = -1);
  // Loading a taken snapshot into the model failed; the old weights stay.
  void ReportLoadFailure(uint64_t version, std::string_view error);

  // True while registered and subscribed.
  bool connected() const;
  // Transfers that failed (network, timeout, checksum, bad manifest). A
  // fetch refused because a newer version replaced it (NOT_FOUND), or cut
  // short by Stop, is not a failure.
  int64_t failures() const;
  // Version of the most recent announcement (0 before the first); it goes
  // down when a restarted learner announces an older checkpoint.
  uint64_t latest_announced() const;
  // Whether this session receives over NCCL, and how many versions came
  // over NCCL so far (verified or not).
  bool using_nccl() const;
  int64_t nccl_versions() const;

  // Cancels the calls in flight, ends the thread and waits for it; returns
  // promptly even in the middle of a backoff or a transfer. Idempotent.
  void Stop();

 private:
  struct State;
  explicit WeightReceiver(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace asympo::broadcast
