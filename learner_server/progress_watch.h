// Whether rank 0 of the learner makes progress, for the readiness check
// (GET /ready on --metrics_address, docs/operations.md "Readiness"). Two
// rules, each over `stall` (--ready_stall_timeout):
//  - the training loop comes round after every step (its checkpoint and
//    publication included) and every idle wait for data (200 ms at most);
//    one that has not come round for `stall` is stuck in a step, a
//    checkpoint or a collective;
//  - work waits (a whole step's groups queued, or submissions held back for
//    room) while the queue has not moved (no group admitted, taken or
//    dropped) for `stall`.
// An idle learner, its queue empty or short of a step, is ready: waiting
// for data is not a hang; but with short steps (`partial_after`,
// --partial_step_after), groups short of a step are work too, which the
// trainer takes within partial_after: the queue not moving for stall +
// partial_after with groups queued is not ready. The training loop reports; any thread checks.
// Thread-safe; Check never waits on the queue or the trainer.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "learner_server/admission/group_queue.h"

namespace asympo::learner {

class ProgressWatch {
 public:
  // `stall` <= 0: always ready. `step_groups`: the groups a step takes
  // (--prompts_per_step). The loop counts as having come round at `start`.
  ProgressWatch(absl::Duration stall, int64_t step_groups, absl::Time start,
                absl::Duration partial_after = absl::ZeroDuration());

  // The training loop came round at `now`, finding the queue as `q`.
  void CameRound(const GroupQueueStats& q, absl::Time now);

  // OK when ready at `now`; UNAVAILABLE saying which rule fails, with the
  // figures behind it.
  absl::Status Check(absl::Time now) const;

 private:
  const absl::Duration stall_;
  const int64_t step_groups_;
  const absl::Duration partial_after_;
  mutable absl::Mutex mu_;
  absl::Time round_ ABSL_GUARDED_BY(mu_);     // the loop last came round
  absl::Time moved_ ABSL_GUARDED_BY(mu_);     // the queue last moved, or nothing waited
  int64_t motion_ ABSL_GUARDED_BY(mu_) = -1;  // admitted + taken + dropped, ever
  int64_t depth_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace asympo::learner
