// What a training step takes from admission and what it gives back, so
// that the learner's loop reads: take, step, commit.
//
// Take drops the queued groups that fell behind the policy-lag bound while
// they waited, pops the step's groups, drops those of them behind the bound
// (queued between the check at admission and a version change), resolves
// the dropped ones as untrained in the ledger, and notes each taken group's
// source and lag. Trained and Skipped resolve the taken groups in the
// ledger (the exactly-once record a checkpoint keeps) and, for a trained
// step, put the lags in the policy-lag figures. A step the learner never
// ran (it stopped first) is neither: its groups stay unresolved, so a
// restart from the checkpoint accepts their batches again.
//
// Short steps: when fewer than a step's groups have been queued for
// `partial_after` (nonzero), Take returns those it finds (at least one), so
// that the last groups of a finished supply are trained rather than kept
// waiting for a step that never fills. Sooner when a submission has waited
// kBlockedFor for room: with fewer than a step's groups queued, one that
// does not fit can only fit after a step (the queue's pass-over rule
// admitted every one that fits), so waiting longer only stalls its sender.
//
// Not thread-safe: the trainer thread's (the queue and the policy lag it
// wraps are thread-safe, and admission keeps using them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/policy_lag.h"

namespace asympo::learner {

// The groups of one step and what the commit needs once they are moved
// into the trainer.
struct TakenGroups {
  std::vector<QueuedGroup> groups;  // in arrival order; the step takes them
  std::vector<GroupRef> refs;       // the same groups, for the ledger
  std::vector<GroupLag> lags;       // each group's source and lag at `version`
  std::vector<std::string> sources;
  uint64_t version = 0;     // the step's training version
  bool short_step = false;  // fewer groups popped than asked for (after partial_after)
  // The queue as Take found it when it took no groups (what the trainer's
  // idle round reports), read once.
  GroupQueueStats queue;
};

// How long a submission waits for room, with fewer than a step's groups
// queued, before they are taken as a short step (partial_after permitting).
inline constexpr absl::Duration kBlockedFor = absl::Seconds(1);

class StepIntake {
 public:
  // `queue` and `lag` outlive the intake.
  StepIntake(GroupQueue* queue, PolicyLag* lag, absl::Duration partial_after = absl::ZeroDuration())
      : queue_(queue), lag_(lag), partial_after_(partial_after) {}

  // The groups of the step that trains at `version`: up to `count`, waiting
  // for them until `deadline`; none when fewer are queued then, unless
  // fewer have been queued for partial_after (then those).
  TakenGroups Take(int64_t count, uint64_t version, absl::Time deadline);
  // The step trained the taken groups but those at the indices `dropped`
  // (sorted; the groups it dropped as poisoned, left out of the lags).
  void Trained(const TakenGroups& taken, const std::vector<size_t>& dropped);
  // The step was skipped: the taken groups left untrained.
  void Skipped(const TakenGroups& taken);

 private:
  GroupQueue* queue_;
  PolicyLag* lag_;
  const absl::Duration partial_after_;
  // Since when Take has found groups queued, but fewer than a step's, and
  // how long a submission had then waited for room.
  absl::Time short_since_ = absl::InfiniteFuture();
  absl::Duration blocked_ = absl::ZeroDuration();
};

}  // namespace asympo::learner
