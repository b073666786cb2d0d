// BroadcastSender's NCCL transport (sender_internal.h): rank assignment in
// Register, and the thread that joins the communicator as rank 0 and
// broadcasts each announced version.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "weight_broadcaster/nccl/nccl_loader.h"
#include "weight_broadcaster/sender_internal.h"

namespace asympo::broadcast::internal {
namespace {

// The communicator failed or could not be built: every receiver goes back
// to gRPC, and those that were on NCCL are announced the latest version.
void NcclFail(SenderState& st, const absl::Status& status) {
  absl::MutexLock lock(&st.mu);
  st.nccl_comm = nullptr;
  if (st.shut_down) return;
  LOG(ERROR) << "NCCL weight transport failed; every receiver falls back to gRPC: " << status;
  st.CountFailure();
  st.nccl_phase = SenderState::NcclPhase::kFailed;
  const std::shared_ptr<const Snapshot> latest = st.store.latest();
  if (latest == nullptr) return;
  for (auto& [id, s] : st.sessions) {
    if (s.stream != nullptr && s.nccl_rank > 0) s.stream->Offer(latest->announcement);
  }
}

// Waits until every rank's session is subscribed (so that the announcement
// reaches it). An error when a rank's session is gone or `deadline` passes.
absl::Status WaitForNcclRanksLocked(SenderState& st, absl::Time deadline)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  const int ranks = static_cast<int>(st.nccl_receivers.size());
  while (!st.shut_down) {
    std::vector<int> state(static_cast<size_t>(ranks) + 1, 0);  // 1 registered, 2 subscribed
    for (const auto& [id, s] : st.sessions) {
      if (s.nccl_rank > 0) state[static_cast<size_t>(s.nccl_rank)] = s.stream != nullptr ? 2 : 1;
    }
    bool all = true;
    for (int r = 1; r <= ranks; ++r) {
      if (state[static_cast<size_t>(r)] == 0) {
        return absl::UnavailableError(absl::StrCat("the session of NCCL rank ", r, " (receiver ",
                                                   st.nccl_receivers[static_cast<size_t>(r - 1)],
                                                   ") ended"));
      }
      all = all && state[static_cast<size_t>(r)] == 2;
    }
    if (all) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("an NCCL rank did not subscribe in time");
    }
    st.nccl_cv.WaitWithTimeout(&st.mu, absl::Milliseconds(10));
  }
  return absl::CancelledError("shutting down");
}

// What the NCCL ranks are announced for `snapshot`: its own announcement,
// or a copy with the sizes of its bucket deltas when it goes as deltas. It
// does when its delta is from `sent`, the version broadcast just before
// over this communicator (every rank took part in it), and every rank's
// receiver takes deltas. A rank that holds no verified base anyway (its
// checksum failed) fetches the version whole over gRPC.
std::shared_ptr<const v1::SnapshotAnnouncement> NcclAnnouncementLocked(
    const SenderState& st, const Snapshot& snapshot, const std::optional<uint64_t>& sent)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  const v1::SnapshotManifest& m = snapshot.manifest();
  const bool all_take_deltas =
      std::all_of(st.nccl_rank_deltas.begin(), st.nccl_rank_deltas.end(), [](bool d) { return d; });
  if (snapshot.delta == nullptr || !m.has_delta_base() || !sent.has_value() ||
      *sent != m.delta_base_version() || !all_take_deltas) {
    return snapshot.announcement;
  }
  auto a = std::make_shared<v1::SnapshotAnnouncement>(*snapshot.announcement);
  for (const std::string& d : snapshot.delta->buckets) a->add_nccl_delta_bytes(d.size());
  return a;
}

// Waits for a snapshot other than `sent` and for every rank's session to
// be subscribed, then announces it to the ranks. Null at shutdown; an
// error when a rank is missing.
absl::StatusOr<std::shared_ptr<const Snapshot>> AnnounceNext(
    SenderState& st, const std::optional<uint64_t>& sent,
    std::shared_ptr<const v1::SnapshotAnnouncement>* announced) {
  absl::MutexLock lock(&st.mu);
  std::shared_ptr<const Snapshot> snapshot;
  // The store's reader signals nccl_cv on every publish.
  while (!st.shut_down && ((snapshot = st.store.latest()) == nullptr ||
                           (sent.has_value() && snapshot->version() == *sent))) {
    st.nccl_cv.Wait(&st.mu);
  }
  if (st.shut_down) return nullptr;
  const absl::Status ready = WaitForNcclRanksLocked(st, absl::Now() + st.options.nccl.timeout);
  if (st.shut_down) return nullptr;
  if (!ready.ok()) return ready;
  *announced = NcclAnnouncementLocked(st, *snapshot, sent);
  for (auto& [id, s] : st.sessions) {
    if (s.nccl_rank > 0 && s.stream != nullptr) s.stream->Offer(*announced);
  }
  return snapshot;
}

// Broadcasts `snapshot`'s buckets in manifest order: each bucket's delta
// where `announced` gives its size, else the bucket, from GPU memory when
// the learner gave the buckets there (no host round trip), else from the
// host buckets through NCCL's staging. Returns the bytes broadcast.
absl::StatusOr<uint64_t> BroadcastVersion(const SenderState& st, NcclBroadcaster& comm,
                                          const Snapshot& snapshot,
                                          const v1::SnapshotAnnouncement& announced) {
  const v1::SnapshotManifest& m = snapshot.manifest();
  const bool delta = announced.nccl_delta_bytes_size() > 0;
  bool corrupt = delta && st.corrupt_delta_versions.contains(snapshot.version());
  uint64_t bytes = 0;
  for (int b = 0; b < m.buckets_size(); ++b) {
    const uint64_t size = m.buckets(b).size_bytes();
    if (size == 0) continue;  // every rank skips empty buckets
    absl::Status status;
    if (delta && announced.nccl_delta_bytes(b) > 0) {
      const std::string* d = &snapshot.delta->buckets[static_cast<size_t>(b)];
      std::string corrupted;  // fault injection: a copy, its last byte flipped
      if (corrupt) {
        corrupted = *d;
        corrupted.back() = static_cast<char>(corrupted.back() ^ 0x5A);
        d = &corrupted;
        corrupt = false;
      }
      // Rank 0 only reads the bytes it broadcasts.
      status = comm.Broadcast(const_cast<char*>(d->data()), d->size());
      bytes += d->size();
    } else {
      const void* on_device = snapshot.device_bucket(b);
      status = on_device == nullptr ? comm.Broadcast(snapshot.bucket(b), size)
                                    : comm.BroadcastFromDevice(on_device, size);
      bytes += size;
    }
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("broadcast of version ", snapshot.version(),
                                                      ": ", status.message()));
    }
  }
  return bytes;
}

// Rank 0: waits for the ranks, joins the communicator, then announces and
// broadcasts the latest snapshot whenever it changes, one at a time.
void NcclLoop(SenderState& st) {
  const int world = st.options.nccl_world_size;
  {
    absl::MutexLock lock(&st.mu);
    while (!st.shut_down && static_cast<int>(st.nccl_receivers.size()) + 1 < world) {
      st.nccl_cv.Wait(&st.mu);
    }
    if (st.shut_down) return;
  }
  LOG(INFO) << "all " << world - 1 << " NCCL receivers registered; joining the communicator";
  absl::StatusOr<std::unique_ptr<NcclBroadcaster>> created =
      NcclBroadcaster::Create(st.nccl_unique_id, 0, world, st.options.nccl_device, st.options.nccl);
  if (!created.ok()) {
    NcclFail(st, created.status());
    return;
  }
  std::unique_ptr<NcclBroadcaster> comm = *std::move(created);
  {
    absl::MutexLock lock(&st.mu);
    if (st.shut_down) return;
    st.nccl_comm = comm.get();
    st.nccl_phase = SenderState::NcclPhase::kRunning;
  }
  LOG(INFO) << "NCCL weight transport up: " << world << " ranks, " << comm->piece_bytes()
            << " bytes per collective";
  std::optional<uint64_t> sent;
  while (true) {
    std::shared_ptr<const v1::SnapshotAnnouncement> announced;
    absl::StatusOr<std::shared_ptr<const Snapshot>> snapshot = AnnounceNext(st, sent, &announced);
    if (snapshot.ok() && *snapshot == nullptr) break;  // shutting down
    absl::StatusOr<uint64_t> bytes =
        snapshot.ok() ? BroadcastVersion(st, *comm, **snapshot, *announced) : snapshot.status();
    if (!bytes.ok()) {
      NcclFail(st, bytes.status());
      return;
    }
    sent = (*snapshot)->version();
    const bool delta = announced->nccl_delta_bytes_size() > 0;
    st.metrics.nccl_bytes.Increment(static_cast<double>(*bytes));
    if (delta) st.metrics.nccl_delta_versions.Increment();
    absl::MutexLock lock(&st.mu);
    ++st.nccl_versions;
    if (delta) ++st.nccl_delta_versions;
    VLOG(1) << "broadcast version " << *sent << " over NCCL (" << *bytes << " bytes"
            << (delta ? ", as deltas)" : ")");
  }
  absl::MutexLock lock(&st.mu);
  st.nccl_comm = nullptr;
}

}  // namespace

int AssignNcclRankLocked(SenderState& st, SenderState::Session& session, bool deltas) {
  if (st.nccl_phase != SenderState::NcclPhase::kCollecting) return 0;
  auto it = std::find(st.nccl_receivers.begin(), st.nccl_receivers.end(), session.receiver_id);
  if (it == st.nccl_receivers.end()) {
    if (static_cast<int>(st.nccl_receivers.size()) + 1 >= st.options.nccl_world_size) return 0;
    st.nccl_receivers.push_back(session.receiver_id);
    st.nccl_rank_deltas.push_back(deltas);
    it = st.nccl_receivers.end() - 1;
    st.nccl_cv.SignalAll();
  }
  session.nccl_rank = static_cast<int>(it - st.nccl_receivers.begin()) + 1;
  st.nccl_rank_deltas[static_cast<size_t>(session.nccl_rank - 1)] = deltas;
  return session.nccl_rank;
}

void StartNccl(SenderState& st) {
  const int world = st.options.nccl_world_size;
  absl::Status usable = absl::OkStatus();
  absl::StatusOr<const NcclApi*> api = LoadNccl(st.options.nccl.load);
  if (!api.ok()) {
    usable = api.status();
  } else if (absl::StatusOr<int> devices = CudaDeviceCount(**api); !devices.ok()) {
    usable = devices.status();
  } else if (*devices <= st.options.nccl_device) {
    usable = absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", st.options.nccl_device, " requested, ", *devices, " visible"));
  } else if (absl::StatusOr<std::string> id = NewNcclUniqueId(st.options.nccl.load); !id.ok()) {
    usable = id.status();
  } else {
    st.nccl_unique_id = *std::move(id);
  }
  if (!usable.ok()) {
    LOG(WARNING) << "NCCL weight transport unavailable, using gRPC for every receiver: " << usable;
    return;
  }
  {
    absl::MutexLock lock(&st.mu);
    st.nccl_phase = SenderState::NcclPhase::kCollecting;
  }
  LOG(INFO) << "NCCL weight transport: waiting for " << world - 1 << " receivers (NCCL "
            << NcclVersionString((*api)->nccl_version) << ")";
  st.nccl_thread = std::thread([&st] { NcclLoop(st); });
}

void CancelNcclLocked(SenderState& st) {
  if (st.nccl_comm != nullptr) st.nccl_comm->Cancel();
}

}  // namespace asympo::broadcast::internal
