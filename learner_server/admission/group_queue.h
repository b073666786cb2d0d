// The learner's bounded queue of prompt groups: what bounds staleness.
//
// Producers (gRPC submissions) push whole batches, all groups or none; the
// trainer pops the groups of a step in arrival order. The queue holds at
// most `capacity_groups` groups. A push that does not fit waits, in FIFO
// order with the other waiting pushes, until the trainer frees room or its
// deadline passes (RESOURCE_EXHAUSTED, nothing of it queued). Accepted groups
// leave only through Pop, or through RemoveIf (the learner's policy-lag
// bound drops, and counts, those that fell behind it).
//
// No head-of-line deadlock: the trainer pops `step_groups` at a time, so
// while fewer are queued it frees no room, and a waiting push that does not
// fit would wait forever for a step that the pushes behind it could
// complete. So while fewer than `step_groups` groups are queued, a push that
// fits is admitted even when earlier ones wait (they keep their order among
// themselves); once a step's worth is queued, the order is FIFO again, so a
// large push gets its turn as soon as steps free room for it.
//
// Exactly-once: a push whose groups carry a batch id the queue has already
// accepted from the same source (principal; ids are one namespace per
// principal) with the same payload is a duplicate (acknowledged, not queued
// again); with another payload it is refused (kBatchIdConflict). The queue remembers the last
// `batch_id_window` accepted ids in a BatchLedger (batch_ledger.h): their digests, which of their
// groups a training step consumed (Resolve), and the trained-through version. The trained batches
// are what a checkpoint keeps (RecordedBatches) and a restart restores (RestoreBatches). The check
// and the admission happen under one lock, so two pushes of one id that wait side by side are
// queued once.
//
// Quotas: a push may carry its source's limit (PushAsync's source_limit):
// the groups of that source queued or waiting, with the push's, may not
// exceed it, or the push is refused at once (kQuota, QuotaCause::
// kQueueShare): it does not wait, since a waiting push would hold up every
// other source's behind it.
//
// Every push ends in one AdmissionResult (admission_result.h).
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
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/rollout.pb.h"
#include "learner_server/admission/admission_result.h"
#include "learner_server/admission/batch_ledger.h"

namespace asympo::learner {

// One accepted group, as it waits for a training step.
struct QueuedGroup {
  v1::PromptGroup group;
  // Learner version when the group was accepted (for the staleness
  // histogram: versions between arrival and use).
  uint64_t arrival_version = 0;
  // Prompt and response tokens of the group, for micro-batching.
  int64_t tokens = 0;
  // RolloutBatch.batch_id of the batch it came in (empty: none), the
  // digest of that batch's groups (BatchDigest), the batch's group count and
  // the group's index in it. Every group of one push carries the same id,
  // digest and count.
  std::string batch_id;
  std::string batch_digest;
  int32_t batch_groups = 0;
  int32_t batch_index = 0;
  // Who submitted it (the principal's name; empty: nobody in particular),
  // for per-source quotas and metrics.
  std::string source;
};

// Which batch a popped group came from, for GroupQueue::Resolve.
struct GroupRef {
  std::string batch_id;
  int32_t batch_index = 0;
  uint64_t arrival_version = 0;
  std::string source;  // the principal whose batch id it is
};
std::vector<GroupRef> RefsOf(const std::vector<QueuedGroup>& groups);

struct GroupQueueOptions {
  // K: the most groups the queue holds.
  int64_t capacity_groups = 256;
  // The most pushes that may wait for room at once; one more is refused at
  // once with RESOURCE_EXHAUSTED. Waiting pushes hold their batches in
  // memory, so this bounds memory beyond the queue itself.
  int64_t max_waiting_pushes = 64;
  // How many accepted batch ids are remembered for deduplication, oldest
  // forgotten first. At least capacity_groups, so that every id with a
  // group still queued is remembered.
  int64_t batch_id_window = 65536;
  // The trainer's step size (LearnerDaemonOptions::prompts_per_step): while
  // fewer groups are queued, waiting pushes that do not fit are passed by
  // later ones that do. 1: strict FIFO.
  int64_t step_groups = 1;
};

struct GroupQueueStats {
  int64_t depth_groups = 0;
  int64_t capacity_groups = 0;
  int64_t waiting_pushes = 0;
  int64_t accepted_groups = 0;     // ever
  int64_t popped_groups = 0;       // ever
  int64_t duplicate_batches = 0;   // pushes answered ALREADY_EXISTS, ever
  int64_t batch_ids = 0;           // ids remembered now
  int64_t batch_id_conflicts = 0;  // pushes refused: a known id with another payload, ever
  int64_t removed_groups = 0;      // by RemoveIf, ever
  int64_t waiting_groups = 0;      // groups of the waiting pushes
  // How long the oldest waiting push has waited (zero: none waits), and the
  // most groups a waiting push holds: what admission waits on.
  absl::Duration oldest_wait = absl::ZeroDuration();
  int64_t largest_waiting = 0;
  int64_t passed_over = 0;  // waiting pushes passed by later ones, ever
};

class GroupQueue {
 public:
  // Called once per push with its result: kAccepted (all groups queued;
  // for a batch restored from a checkpoint with groups untrained, those
  // groups), kDuplicate (the batch id was accepted before with the same
  // payload: nothing queued, and the push counts as delivered; recorded()
  // when the restored checkpoint recorded it trained in full),
  // kBatchIdConflict (with another payload: refused), kFull (deadline
  // passed or too many waiting; nothing queued), kQuota, kInvalid,
  // kUnavailable (queue closed) or kCancelled (CancelPush). May run on the
  // pushing thread, the popping thread or the queue's timer thread, never
  // under the lock.
  using PushDone = std::function<void(const AdmissionResult&)>;

  explicit GroupQueue(GroupQueueOptions options);
  ~GroupQueue();  // closes the queue and stops the timer thread

  // Queues `groups` (all or none) when they fit and no earlier push is
  // waiting; otherwise waits until `deadline`. kInvalid, at once, when more
  // groups than the capacity are pushed. With `source_limit` > 0, kQuota at
  // once when the groups' source would then hold more than that many groups
  // (queued or waiting). Returns a ticket for CancelPush (0 once `done` has
  // already run).
  uint64_t PushAsync(std::vector<QueuedGroup> groups, absl::Time deadline, PushDone done,
                     int64_t source_limit = 0);

  // Groups queued or waiting, by source (sources holding none are left out).
  std::vector<std::pair<std::string, int64_t>> HeldBySource() const;

  // Blocking form of PushAsync.
  AdmissionResult Push(std::vector<QueuedGroup> groups, absl::Time deadline);

  // Withdraws a waiting push (its `done` runs with CANCELLED). No effect if
  // the push already completed.
  void CancelPush(uint64_t ticket);

  // Waits until `count` groups are queued (or the deadline passes, or the
  // queue is closed and drained), then removes and returns up to `count`
  // groups in arrival order: none when fewer than `min_count` (default:
  // `count`) are queued at the deadline, unless the queue is closed. Admits
  // waiting pushes that now fit.
  std::vector<QueuedGroup> Pop(int64_t count, absl::Time deadline, int64_t min_count = 0);

  // Removes the queued groups for which `drop` is true (the others keep
  // their order), then admits the waiting pushes that now fit, removing
  // theirs for which `drop` is true too; returns the removed groups, which
  // count in Stats().removed_groups. `drop` runs under the queue's lock:
  // it must not call the queue.
  std::vector<QueuedGroup> RemoveIf(const std::function<bool(const QueuedGroup&)>& drop);

  // Records that these popped groups left for good: trained by a step
  // (`trained`), or skipped or dropped. Groups removed by RemoveIf are
  // resolved by it.
  void Resolve(const std::vector<GroupRef>& groups, bool trained);
  // The remembered batches of which a step trained at least one group,
  // oldest first, with the groups trained: what a checkpoint keeps. A batch
  // still wholly queued is left out, so that a restart from the checkpoint
  // accepts it again; a partly trained one is accepted again for its
  // untrained groups only.
  std::vector<CheckpointBatch> RecordedBatches() const;
  // Remembers `batches` (from a checkpoint).
  void RestoreBatches(const std::vector<CheckpointBatch>& batches);
  // Every batch accepted at a version below this is resolved (LearnerStatus.
  // trained_through_version); `version` is the learner's now, the most it
  // returns.
  uint64_t TrainedThrough(uint64_t version) const;

  // Refuses new pushes (UNAVAILABLE) and fails waiting ones; queued groups
  // stay until popped. Wakes every waiter.
  void Close();

  GroupQueueStats Stats() const;
  // Groups queued now (Stats().depth_groups, without the waiting pushes'
  // figures: what each Submit's reply carries).
  int64_t depth_groups() const;
  int64_t capacity() const { return options_.capacity_groups; }
  const GroupQueueOptions& options() const { return options_; }

 private:
  struct Waiter {
    uint64_t ticket;
    std::vector<QueuedGroup> groups;
    absl::Time deadline;
    PushDone done;
    absl::Time since;     // when it began to wait
    bool passed = false;  // a later push was admitted before it
  };
  using Completion = std::pair<PushDone, AdmissionResult>;

  // Moves waiting pushes that fit into the queue, in FIFO order (passing
  // over those that do not fit while a step is short: see above).
  void AdmitWaitersLocked(std::vector<Completion>* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fewer than a step's groups are queued: the trainer frees no room.
  bool StepShortLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FitsLocked(int64_t groups) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the waiting pushes before `end` passed over by a later one.
  void PassOverLocked(std::list<Waiter>::iterator end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to a waiting push whose deadline passed.
  absl::Status DeadlinePassedLocked(const Waiter& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enqueue(std::vector<QueuedGroup>* groups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kAccepted when `groups` may be queued (a resend's are cut to its
  // untrained groups); else the duplicate or conflict answer (and counts it).
  AdmissionResult AdmitIdLocked(std::vector<QueuedGroup>* groups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push of `groups` left the waiting list without being queued, or
  // groups of `source` left the queue.
  void ReleaseLocked(const std::string& source, int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePushLocked(const std::vector<QueuedGroup>& groups) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  int64_t duplicate_batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t removed_groups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batch_id_conflicts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t passed_over_ ABSL_GUARDED_BY(mu_) = 0;
  BatchLedger ledger_ ABSL_GUARDED_BY(mu_);
  // Groups queued or waiting, by source.
  absl::flat_hash_map<std::string, int64_t> held_ ABSL_GUARDED_BY(mu_);
  std::thread timer_;
};

}  // namespace asympo::learner
