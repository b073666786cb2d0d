// What the daemon of one rank does, whichever its role: LearnerRank0
// (learner_rank0.h) or, on the other ranks of a data-parallel job,
// LearnerWorker (learner_worker.h). LearnerDaemon (learner_daemon.h) builds
// the one its options name.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace asympo::learner {

class LearnerRole {
 public:
  virtual ~LearnerRole() = default;

  // Trains until Shutdown(), max_steps or rank 0's stop; then rank 0
  // checkpoints. Returns the number of steps this run trained.
  virtual absl::StatusOr<int64_t> Run() = 0;
  // Any thread; Run returns after the current step (a worker stops with
  // rank 0, not on its own).
  virtual void Shutdown() = 0;
  // The bytes of every request taken in so far, on every method and
  // whatever became of it (common/daemon/heap_release.h); 0 on a worker,
  // which serves nothing. Any thread.
  virtual int64_t received_bytes() const = 0;
  // The policy version (the trainer's). Any thread.
  virtual uint64_t version() const = 0;
  // OK while this rank makes progress (ProgressWatch, rank 0), else
  // UNAVAILABLE saying why; a worker, which serves nothing, is ready. Any
  // thread; never waits on the trainer.
  virtual absl::Status Readiness() const { return absl::OkStatus(); }
};

}  // namespace asympo::learner
