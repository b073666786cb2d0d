#include "learner_server/admission/step_intake.h"

#include <utility>

namespace asympo::learner {
namespace {

bool SameGroup(const GroupRef& a, const GroupRef& b) {
  return a.batch_id == b.batch_id && a.batch_index == b.batch_index &&
         a.arrival_version == b.arrival_version && a.source == b.source;
}

// The refs of `all` not in `kept` (both in pop order, `kept` a subsequence).
std::vector<GroupRef> NotIn(const std::vector<GroupRef>& all, const std::vector<GroupRef>& kept) {
  std::vector<GroupRef> out;
  size_t k = 0;
  for (const GroupRef& r : all) {
    if (k < kept.size() && SameGroup(r, kept[k])) {
      ++k;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

TakenGroups StepIntake::Take(int64_t count, uint64_t version, absl::Time deadline) {
  TakenGroups taken;
  taken.version = version;
  lag_->DropBehind(*queue_, version);
  const bool partial = partial_after_ > absl::ZeroDuration() &&
                       (absl::Now() - short_since_ >= partial_after_ ||
                        (short_since_ != absl::InfiniteFuture() && blocked_ >= kBlockedFor));
  taken.groups = queue_->Pop(count, deadline, partial ? 1 : count);
  blocked_ = absl::ZeroDuration();
  if (!taken.groups.empty()) {
    short_since_ = absl::InfiniteFuture();
    taken.short_step = static_cast<int64_t>(taken.groups.size()) < count;
  } else {
    taken.queue = queue_->Stats();
    if (taken.queue.depth_groups == 0) {
      short_since_ = absl::InfiniteFuture();
    } else if (short_since_ == absl::InfiniteFuture()) {
      short_since_ = absl::Now();
    }
    blocked_ = taken.queue.oldest_wait;
  }
  const std::vector<GroupRef> popped = RefsOf(taken.groups);
  lag_->DropPopped(&taken.groups, version);  // queued as the version moved on
  taken.refs = RefsOf(taken.groups);
  queue_->Resolve(NotIn(popped, taken.refs), /*trained=*/false);
  taken.lags = LagsOf(taken.groups, version);
  taken.sources.reserve(taken.groups.size());
  for (const QueuedGroup& g : taken.groups) taken.sources.push_back(g.source);
  return taken;
}

void StepIntake::Trained(const TakenGroups& taken, const std::vector<size_t>& dropped) {
  lag_->ObserveTrained(taken.lags, dropped);
  queue_->Resolve(taken.refs, /*trained=*/true);
}

void StepIntake::Skipped(const TakenGroups& taken) {
  queue_->Resolve(taken.refs, /*trained=*/false);
}

}  // namespace asympo::learner
