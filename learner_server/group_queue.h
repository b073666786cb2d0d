// The learner's bounded queue of prompt groups: what bounds staleness.
//
// Producers (gRPC submissions) push whole batches, all groups or none; the
// trainer pops the groups of a step in arrival order. The queue holds at
// most `capacity_groups` groups. A push that does not fit waits, in FIFO
// order with the other waiting pushes, until the trainer frees room or its
// deadline passes (RESOURCE_EXHAUSTED, nothing of it queued). Accepted groups
// are never dropped: they leave only through Pop.
//
// Waiting is asynchronous (PushAsync calls back), so gRPC callback reactors
// never block; Push is the blocking form. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/rollout.pb.h"

namespace asympo::learner {

// One accepted group, as it waits for a training step.
struct QueuedGroup {
  v1::PromptGroup group;
  // Learner version when the group was accepted (for the staleness
  // histogram: versions between arrival and use).
  uint64_t arrival_version = 0;
  // Prompt and response tokens of the group, for micro-batching.
  int64_t tokens = 0;
};

struct GroupQueueOptions {
  // K: the most groups the queue holds.
  int64_t capacity_groups = 256;
  // The most pushes that may wait for room at once; one more is refused at
  // once with RESOURCE_EXHAUSTED. Waiting pushes hold their batches in
  // memory, so this bounds memory beyond the queue itself.
  int64_t max_waiting_pushes = 64;
};

struct GroupQueueStats {
  int64_t depth_groups = 0;
  int64_t capacity_groups = 0;
  int64_t waiting_pushes = 0;
  int64_t accepted_groups = 0;  // ever
  int64_t popped_groups = 0;    // ever
};

class GroupQueue {
 public:
  // Called once per push with OK (all groups queued), RESOURCE_EXHAUSTED
  // (deadline passed or too many waiting; nothing queued), UNAVAILABLE
  // (queue closed) or CANCELLED (CancelPush). May run on the pushing thread,
  // the popping thread or the queue's timer thread, never under the lock.
  using PushDone = std::function<void(const absl::Status&)>;

  explicit GroupQueue(GroupQueueOptions options);
  ~GroupQueue();  // closes the queue and stops the timer thread

  // Queues `groups` (all or none) when they fit and no earlier push is
  // waiting; otherwise waits until `deadline`. INVALID_ARGUMENT, at once,
  // when more groups than the capacity are pushed. Returns a ticket for
  // CancelPush (0 once `done` has already run).
  uint64_t PushAsync(std::vector<QueuedGroup> groups, absl::Time deadline, PushDone done);

  // Blocking form of PushAsync.
  absl::Status Push(std::vector<QueuedGroup> groups, absl::Time deadline);

  // Withdraws a waiting push (its `done` runs with CANCELLED). No effect if
  // the push already completed.
  void CancelPush(uint64_t ticket);

  // Waits until `count` groups are queued (or the deadline passes, or the
  // queue is closed and drained), then removes and returns up to `count`
  // groups in arrival order. Admits waiting pushes that now fit.
  std::vector<QueuedGroup> Pop(int64_t count, absl::Time deadline);

  // Refuses new pushes (UNAVAILABLE) and fails waiting ones; queued groups
  // stay until popped. Wakes every waiter.
  void Close();

  GroupQueueStats Stats() const;
  int64_t capacity() const { return options_.capacity_groups; }

 private:
  struct Waiter {
    uint64_t ticket;
    std::vector<QueuedGroup> groups;
    absl::Time deadline;
    PushDone done;
  };
  using Completion = std::pair<PushDone, absl::Status>;

  // Moves waiting pushes that fit into the queue, in FIFO order.
  void AdmitWaitersLocked(std::vector<Completion>* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enqueue(std::vector<QueuedGroup>* groups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const GroupQueueOptions options_;
  mutable absl::Mutex mu_;
  std::deque<QueuedGroup> queue_ ABSL_GUARDED_BY(mu_);
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Bumped whenever waiters_ changes, to wake the timer thread.
  uint64_t waiters_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t accepted_groups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t popped_groups_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread timer_;
};

}  // namespace asympo::learner
