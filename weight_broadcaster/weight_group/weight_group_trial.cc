// The weight group's trials (weight_group.h, "Membership"): newcomers
// rendezvous with rank 0 alone while the current generation goes on, and
// members are admitted and blamed here.
#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "weight_broadcaster/weight_group/weight_group_state.h"

namespace asympo::broadcast {
namespace {

std::string NewToken() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

}  // namespace

bool WeightGroup::State::InUseLocked(const std::string& id) {
  if (joiners.contains(id) || proven.contains(id) || rejoining.contains(id)) return true;
  for (const Member& m : members) {
    if (m.worker_id == id) return true;
  }
  if (trial != nullptr) {
    for (const Member& m : trial->members) {
      if (m.worker_id == id) return true;
    }
  }
  return false;
}

WeightGroup::State::Member WeightGroup::State::AdmitLocked(Joiner& j, uint64_t gen, int rank,
                                                           int world, absl::Time now) {
  j.formed = true;
  j.generation = gen;
  j.rank = rank;
  j.world_size = world;
  j.token = NewToken();
  Member m;
  m.worker_id = j.worker_id;
  m.token = j.token;
  m.rank = j.rank;
  m.last_seen = now;
  joiners.erase(j.worker_id);
  ids.Touch(j.worker_id, now);
  return m;
}

std::vector<std::string> WeightGroup::State::BlameLocked(
    const std::vector<Member>& failed, const absl::flat_hash_set<std::string>& suspects) {
  std::vector<std::string> blamed;
  for (const Member& m : failed) {
    if (m.store_ops == 0) blamed.push_back(m.worker_id);
  }
  if (blamed.empty()) {
    for (const Member& m : failed) {
      if (suspects.contains(m.worker_id)) blamed.push_back(m.worker_id);
    }
  }
  const absl::Time now = absl::Now();
  for (const std::string& id : blamed) {
    const absl::Duration d = ids.KeepOut(id, now);
    LOG(WARNING) << "weight group: " << id << " failed the rendezvous; kept out for "
                 << absl::FormatDuration(d);
  }
  return blamed;
}

void WeightGroup::State::StartTrialLocked() {
  if (static_cast<int>(members.size()) >= options.max_members) return;  // no room
  if (trial_thread.joinable()) trial_thread.join();                     // the last trial's, ended
  trial = std::make_unique<Trial>();
  trial_thread = std::thread([this] { RunTrial(); });
}

void WeightGroup::State::RunTrial() {
  std::shared_ptr<GenerationStore> trial_store;
  int world = 0;
  uint64_t gen = 0;
  {
    absl::MutexLock lock(&mu);
    // Newcomers started together go into one trial.
    const absl::Time deadline = absl::Now() + options.join_window;
    while (!shut_down && absl::Now() < deadline) cv.WaitWithDeadline(&mu, deadline);
    std::vector<std::shared_ptr<Joiner>> picked;
    for (const auto& [id, j] : joiners) {
      if (!proven.contains(id)) picked.push_back(j);
    }
    std::sort(picked.begin(), picked.end(),
              [](const auto& a, const auto& b) { return a->seq < b->seq; });
    const size_t room =
        static_cast<size_t>(std::max(0, options.max_members - static_cast<int>(members.size())));
    if (picked.size() > room) picked.resize(room);
    if (shut_down || picked.empty() || trial == nullptr) {
      trial.reset();
      cv.SignalAll();
      return;
    }
    gen = trial->generation = ++last_generation;
    world = static_cast<int>(picked.size()) + 1;
    trial_store = trial->store = std::make_shared<GenerationStore>(options);
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < picked.size(); ++i) {
      trial->members.push_back(AdmitLocked(*picked[i], gen, static_cast<int>(i) + 1, world, now));
    }
    LOG(INFO) << "weight group: trial " << gen << " of " << picked.size()
              << " newcomer(s) while generation " << generation << " goes on";
    cv.SignalAll();  // their Joins return
  }
  c10::intrusive_ptr<collective::CollectiveGroup> trial_pg;
  std::string error;
  try {
    trial_pg = NewRankZero(trial_store->store(), world);
  } catch (const std::exception& e) {
    error = e.what();
  }
  trial_pg.reset();  // it proved the newcomers; the next generation has its own
  absl::MutexLock lock(&mu);
  if (trial == nullptr || shut_down) return;
  if (error.empty()) {
    for (const Member& m : trial->members) {
      proven.insert(m.worker_id);
      ids.Cleared(m.worker_id);
    }
    RegroupLocked("newcomers completed their rendezvous");
  } else {
    LOG(WARNING) << "weight group: trial " << gen
                 << " did not connect: " << error.substr(0, error.find('\n'));
    Fail("trial_rendezvous");
    absl::flat_hash_set<std::string> all;
    for (const Member& m : trial->members) all.insert(m.worker_id);
    BlameLocked(trial->members, all);
  }
  // Its members' tokens end: their Next answers REJOIN, their Store calls
  // FAILED_PRECONDITION, and those proven join the next generation.
  trial.reset();
  cv.SignalAll();
}

}  // namespace asympo::broadcast
