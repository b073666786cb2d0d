// The weight group's thread (weight_group.h): forms generations, connects
// the process groups, broadcasts versions.
#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "weight_broadcaster/weight_group/weight_group_state.h"
#include "weight_broadcaster/weight_group/weight_group_store.h"

namespace asympo::broadcast {
void WeightGroup::State::Loop() {
  while (true) {
    enum { kStop, kForm, kBroadcast } next;
    {
      absl::MutexLock lock(&mu);
      while (true) {
        if (shut_down) {
          next = kStop;
          break;
        }
        const absl::Time now = absl::Now();
        const std::shared_ptr<const Snapshot> latest = snapshots->latest();
        // Members gone quiet, or not asking while another waits for the latest.
        if (phase == Phase::kActive) {
          absl::Time first_ask = absl::InfiniteFuture();
          for (const Member& m : members) {
            if (m.asking && !m.told && Lacks(m, latest.get())) {
              first_ask = std::min(first_ask, m.asked_since);
            }
          }
          for (const Member& m : members) {
            const bool quiet = m.calls == 0 && now - m.last_seen > options.ready_timeout;
            const bool late = !(m.asking && !m.told) && now - first_ask > options.ready_timeout;
            if (quiet || late) {
              LOG(WARNING) << "weight group: " << m.worker_id << " (rank " << m.rank << ") "
                           << (quiet ? "made no call" : "did not ask for the next version")
                           << " for " << absl::FormatDuration(options.ready_timeout)
                           << "; generation " << generation << " ends without it";
              Fail("ready_timeout");
              RegroupLocked("a member timed out");
              break;
            }
          }
        }
        const bool boundary = phase == Phase::kNone || phase == Phase::kActive;
        if (boundary && regroup) {  // a member gone, a failure, newcomers proven
          next = kForm;
          break;
        }
        // Joiners not yet proven: with no generation, they form one; beside
        // a generation with members, they go through a trial first.
        bool any_new = false;
        for (const auto& [id, j] : joiners) any_new = any_new || !proven.contains(id);
        if (any_new && phase == Phase::kNone) {
          next = kForm;
          break;
        }
        if (any_new && phase != Phase::kForming && phase != Phase::kNone && trial == nullptr) {
          StartTrialLocked();
        }
        if (phase == Phase::kActive && latest != nullptr && !members.empty()) {
          bool all_asking = true, any_lacks = false;
          for (const Member& m : members) {
            all_asking = all_asking && m.asking && !m.told;
            any_lacks = any_lacks || Lacks(m, latest.get());
          }
          if (all_asking && any_lacks) {
            next = kBroadcast;
            break;
          }
        }
        cv.WaitWithTimeout(&mu, absl::Milliseconds(200));
      }
    }
    if (next == kStop) break;
    if (next == kForm) Form();
    if (next == kBroadcast) Broadcast();
  }
  absl::MutexLock lock(&mu);
  TellAllLocked(v1::GroupNextResponse::ACTION_REJOIN);
  phase = Phase::kNone;
  pg.reset();
  store.reset();
  trial.reset();
  cv.SignalAll();
}

std::vector<std::shared_ptr<WeightGroup::State::Joiner>> WeightGroup::State::EndAndGatherLocked() {
  // The old generation ends: its members are told to join again. The new
  // one takes them and the proven newcomers; only when nobody is expected,
  // every joiner.
  rejoining.clear();
  for (const Member& m : members) rejoining.insert(m.worker_id);
  std::vector<std::string> expected(rejoining.begin(), rejoining.end());
  for (const std::string& id : proven) {
    if (!rejoining.contains(id)) expected.push_back(id);
  }
  if (!members.empty()) {
    LOG(INFO) << "weight group: generation " << generation << " ends ("
              << (regroup ? regroup_reason : std::string("workers joining")) << ")";
  }
  TellAllLocked(v1::GroupNextResponse::ACTION_REJOIN);
  members.clear();
  pg.reset();
  store.reset();
  regroup = false;
  phase = Phase::kForming;
  generation = ++last_generation;
  generation_gauge->Set(static_cast<double>(generation));
  members_gauge->Set(0);
  // Gather Joins for the join window: workers started together form one
  // generation. After a generation with members, as soon as all of them
  // are back (a restart, a new worker beside them).
  const absl::Time deadline = absl::Now() + options.join_window;
  while (!shut_down && absl::Now() < deadline) {
    bool all_back = !expected.empty();
    for (const std::string& id : expected) all_back = all_back && joiners.contains(id);
    if (all_back) break;
    cv.WaitWithDeadline(&mu, deadline);
  }
  std::vector<std::shared_ptr<Joiner>> joined;
  if (shut_down) return joined;
  for (const auto& [id, j] : joiners) {
    if (expected.empty() || rejoining.contains(id) || proven.contains(id)) joined.push_back(j);
  }
  std::sort(joined.begin(), joined.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  if (static_cast<int>(joined.size()) > options.max_members) {
    joined.resize(static_cast<size_t>(options.max_members));
  }
  return joined;
}

void WeightGroup::State::AssignLocked(const std::vector<std::shared_ptr<Joiner>>& joined) {
  const int world = static_cast<int>(joined.size()) + 1;
  const absl::Time now = absl::Now();
  newcomers.clear();
  for (size_t i = 0; i < joined.size(); ++i) {
    Joiner& j = *joined[i];
    if (proven.contains(j.worker_id) && !rejoining.contains(j.worker_id)) {
      newcomers.insert(j.worker_id);
    }
    members.push_back(AdmitLocked(j, generation, static_cast<int>(i) + 1, world, now));
  }
  proven.clear();  // the proven that did not come back go through a trial again
  rejoining.clear();
  phase = Phase::kConnecting;
  cv.SignalAll();  // the Joins return
}

void WeightGroup::State::Form() {
  std::shared_ptr<GenerationStore> new_store;
  uint64_t gen = 0;
  int world = 0;
  {
    absl::MutexLock lock(&mu);
    const std::vector<std::shared_ptr<Joiner>> joined = EndAndGatherLocked();
    if (shut_down) return;
    if (joined.empty()) {
      proven.clear();
      rejoining.clear();
      phase = Phase::kNone;
      return;
    }
    gen = generation;
    world = static_cast<int>(joined.size()) + 1;
    new_store = std::make_shared<GenerationStore>(options);
    store = new_store;
    AssignLocked(joined);
  }
  // Rank 0's process group, while the members build theirs.
  c10::intrusive_ptr<collective::CollectiveGroup> new_pg;
  std::string error;
  try {
    new_pg = NewRankZero(new_store->store(), world);
  } catch (const std::exception& e) {
    error = e.what();
  }
  absl::MutexLock lock(&mu);
  if (gen != generation || shut_down) return;
  if (new_pg == nullptr) {
    LOG(WARNING) << "weight group: generation " << gen << " (" << world
                 << " ranks) did not connect: " << error.substr(0, error.find('\n'));
    Fail("rendezvous");
    BlameLocked(members, newcomers);
    phase = Phase::kActive;  // a boundary: the loop forms the next one
    RegroupLocked("the rendezvous failed");
    return;
  }
  for (const Member& m : members) ids.Cleared(m.worker_id);
  pg = new_pg;
  phase = Phase::kActive;
  members_gauge->Set(static_cast<double>(members.size()));
  std::string ids;
  for (const Member& m : members) absl::StrAppend(&ids, ids.empty() ? "" : ", ", m.worker_id);
  LOG(INFO) << "weight group: generation " << gen << " connected, " << world << " ranks (learner + "
            << ids << ")";
  cv.SignalAll();
}

namespace {

// What every member's Next answers with for the broadcast of `s`.
std::shared_ptr<const v1::GroupNextResponse> ReceiveOf(const Snapshot& s, bool delta) {
  auto r = std::make_shared<v1::GroupNextResponse>();
  r->set_action(v1::GroupNextResponse::ACTION_RECEIVE);
  *r->mutable_manifest() = s.manifest();
  if (delta) {
    r->set_delta(true);
    for (const std::string& d : s.delta->buckets) r->add_delta_bucket_bytes(d.size());
  }
  return r;
}

}  // namespace

void WeightGroup::State::BroadcastBytes(collective::CollectiveGroup& group, const char* data,
                                        const void* on_device, int64_t size) {
  // The root's tensor is only read.
  at::Tensor t =
      at::from_blob(const_cast<char*>(data), {size}, at::TensorOptions().dtype(at::kByte));
  if (options.backend == "nccl") {
    const at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(options.nccl_device));
    if (on_device != nullptr) {
      // The learner's staged copy on this GPU: no copy to the host and back.
      t = at::from_blob(const_cast<void*>(on_device), {size},
                        at::TensorOptions().dtype(at::kByte).device(dev));
    } else {
      if (!device_buffer.defined() || device_buffer.numel() < size) {
        device_buffer = at::empty({size}, at::TensorOptions().dtype(at::kByte).device(dev));
      }
      at::Tensor d = device_buffer.narrow(0, 0, size);
      d.copy_(t);
      t = d;
    }
  }
  std::vector<at::Tensor> tensors{t};
  c10d::BroadcastOptions bo;
  bo.rootRank = 0;
  bo.timeout = Millis(options.timeout);
  group.broadcast(tensors, bo)->wait(Millis(options.timeout));
}

void WeightGroup::State::Broadcast() {
  std::shared_ptr<const Snapshot> snapshot;
  c10::intrusive_ptr<collective::CollectiveGroup> group;
  uint64_t gen = 0;
  bool delta = false;
  {
    absl::MutexLock lock(&mu);
    snapshot = snapshots->latest();
    group = pg;
    gen = generation;
    phase = Phase::kBroadcasting;
    delta = DeltaFitsLocked(*snapshot);
    // Each member's Next takes the manifest from here: a small bucket's
    // broadcast may end on rank 0 before a member's call has returned.
    TellAllLocked(v1::GroupNextResponse::ACTION_RECEIVE, ReceiveOf(*snapshot, delta));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  int64_t bytes = 0;
  const std::vector<uint64_t>& faults = options.corrupt_delta_versions;
  const bool corrupt = std::find(faults.begin(), faults.end(), snapshot->version()) != faults.end();
  try {
    for (const v1::BucketInfo& b : snapshot->manifest().buckets()) {
      const int index = static_cast<int>(b.index());
      // The bucket's delta, or null where it goes whole (an empty delta).
      const std::string* d =
          delta ? &snapshot->delta->buckets[static_cast<size_t>(index)] : nullptr;
      if (d != nullptr && d->empty()) d = nullptr;
      const int64_t size = static_cast<int64_t>(d != nullptr ? d->size() : b.size_bytes());
      if (size == 0) continue;  // every rank skips an empty bucket
      if (d != nullptr) {
        std::string flipped;
        if (corrupt) {  // testing only
          flipped = *d;
          flipped.back() = static_cast<char>(flipped.back() ^ 0x5a);
        }
        BroadcastBytes(*group, corrupt ? flipped.data() : d->data(), nullptr, size);
      } else {
        BroadcastBytes(*group, snapshot->bucket(index), snapshot->device_bucket(index), size);
      }
      bytes += size;
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  absl::MutexLock lock(&mu);
  if (gen != generation) return;
  phase = Phase::kActive;
  if (!error.empty()) {
    LOG(WARNING) << "weight group: broadcast of version " << snapshot->version()
                 << " in generation " << gen << " failed: " << error.substr(0, error.find('\n'));
    Fail("broadcast");
    RegroupLocked("a broadcast failed");
    return;
  }
  // Every member took part: a long broadcast is not silence.
  const absl::Time now = absl::Now();
  for (Member& m : members) m.last_seen = now;
  ++versions_sent;
  versions_total->Increment();
  if (delta) delta_versions_total->Increment();
  bytes_total->Increment(static_cast<double>(bytes));
  VLOG(1) << "weight group: version " << snapshot->version() << (delta ? " (delta, " : " (")
          << bytes << " bytes) to " << members.size() << " members in "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  cv.SignalAll();
}

}  // namespace asympo::broadcast
