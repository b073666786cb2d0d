#include "learner_server/admission/group_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"

namespace asympo::learner {
namespace {

void RunAll(std::vector<std::pair<GroupQueue::PushDone, AdmissionResult>>* done) {
  for (auto& [fn, status] : *done) fn(status);
  done->clear();
}

AdmissionResult Duplicate(const std::vector<QueuedGroup>& groups, bool recorded) {
  const std::string id = QuoteForMessage(groups.front().batch_id);
  return AdmissionResult::Duplicate(absl::AlreadyExistsError(absl::StrCat(
                                        "batch_id ", id, " was accepted before; not queued again")),
                                    recorded);
}

AdmissionResult Conflict(const std::vector<QueuedGroup>& groups) {
  const std::string id = QuoteForMessage(groups.front().batch_id);
  return AdmissionResult::Refused(
      AdmissionOutcome::kBatchIdConflict,
      absl::AlreadyExistsError(absl::StrCat(
          "batch_id ", id,
          " was accepted before with another payload; not queued: a batch id names one payload, "
          "so new data needs a new id (a retry must send the same groups)")));
}

AdmissionResult Full(absl::Status status) {
  return AdmissionResult::Refused(AdmissionOutcome::kFull, std::move(status));
}

// The source of a push (every group of one push has the same).
const std::string& SourceOf(const std::vector<QueuedGroup>& groups) {
  static const std::string kNone;
  return groups.empty() ? kNone : groups.front().source;
}

}  // namespace

void GroupQueue::ReleaseLocked(const std::string& source, int64_t n) {
  auto it = held_.find(source);
  if (it == held_.end()) return;
  it->second -= n;
  if (it->second <= 0) held_.erase(it);
}

void GroupQueue::ReleasePushLocked(const std::vector<QueuedGroup>& groups) {
  ReleaseLocked(SourceOf(groups), static_cast<int64_t>(groups.size()));
}

std::vector<std::pair<std::string, int64_t>> GroupQueue::HeldBySource() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, int64_t>> out(held_.begin(), held_.end());
  std::sort(out.begin(), out.end());
  return out;
}

GroupQueue::GroupQueue(GroupQueueOptions options)
    : options_(options), ledger_(options.batch_id_window), timer_([this] { TimerLoop(); }) {}

GroupQueue::~GroupQueue() {
  Close();
  timer_.join();
}

AdmissionResult GroupQueue::AdmitIdLocked(std::vector<QueuedGroup>* groups) {
  if (groups->empty() || groups->front().batch_id.empty()) return AdmissionResult::Accepted();
  const QueuedGroup& first = groups->front();
  std::vector<int32_t> untrained;
  switch (ledger_.Check(first.source, first.batch_id, first.batch_digest, first.batch_groups,
                        &untrained)) {
    case BatchLedger::Seen::kNew:
      return AdmissionResult::Accepted();
    case BatchLedger::Seen::kDuplicate:
      ++duplicate_batches_;
      return Duplicate(*groups, /*recorded=*/false);
    case BatchLedger::Seen::kRecorded:
      ++duplicate_batches_;
      return Duplicate(*groups, /*recorded=*/true);
    case BatchLedger::Seen::kConflict:
      ++batch_id_conflicts_;
      return Conflict(*groups);
    case BatchLedger::Seen::kResend:
      break;
  }
  // Restored from a checkpoint with groups no step trained: those only.
  std::vector<QueuedGroup> kept;
  for (int32_t i : untrained) {
    for (QueuedGroup& g : *groups) {
      if (g.batch_index == i) kept.push_back(std::move(g));
    }
  }
  *groups = std::move(kept);
  return AdmissionResult::Accepted();
}

void GroupQueue::Enqueue(std::vector<QueuedGroup>* groups) {
  if (!groups->empty()) {
    const QueuedGroup& g = groups->front();
    ledger_.Accept(g.source, g.batch_id, g.batch_digest, g.batch_groups,
                   static_cast<int32_t>(groups->size()), g.arrival_version);
  }
  accepted_groups_ += static_cast<int64_t>(groups->size());
  for (QueuedGroup& g : *groups) queue_.push_back(std::move(g));
  groups->clear();
}

uint64_t GroupQueue::PushAsync(std::vector<QueuedGroup> groups, absl::Time deadline, PushDone done,
                               int64_t source_limit) {
  const std::string source = SourceOf(groups);
  AdmissionResult result = AdmissionResult::Accepted();
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    result = closed_ ? AdmissionResult::Refused(
                           AdmissionOutcome::kUnavailable,
                           absl::UnavailableError(
                               "the learner is shutting down and accepts no more batches"))
                     : AdmitIdLocked(&groups);
    const int64_t n = static_cast<int64_t>(groups.size());
    const auto held = held_.find(source);
    const int64_t source_holds = held == held_.end() ? 0 : held->second;
    if (!result.accepted()) {
      // closed, a duplicate or a conflict
    } else if (n > options_.capacity_groups) {
      result = AdmissionResult::Refused(
          AdmissionOutcome::kInvalid,
          absl::InvalidArgumentError(
              absl::StrCat("batch has ", n, " groups, more than the learner's queue capacity ",
                           options_.capacity_groups, "; send smaller batches")));
    } else if (source_limit > 0 && source_holds + n > source_limit) {
      result = AdmissionResult::OverQuota(
          QuotaCause::kQueueShare,
          absl::ResourceExhaustedError(
              absl::StrCat("source ", QuoteForMessage(source), " holds ", source_holds,
                           " groups in the learner's queue and its share is ", source_limit,
                           "; this batch of ", n, " waits until the learner trains some of them")));
    } else if ((waiters_.empty() || StepShortLocked()) && FitsLocked(n)) {
      // Waiting pushes that do not fit are passed while a step is short.
      if (!waiters_.empty()) PassOverLocked(waiters_.end());
      held_[source] += n;
      Enqueue(&groups);
    } else if (static_cast<int64_t>(waiters_.size()) >= options_.max_waiting_pushes) {
      result = Full(absl::ResourceExhaustedError(absl::StrCat(
          "the learner's queue is full (", queue_.size(), " of ", options_.capacity_groups,
          " groups) and ", waiters_.size(), " submissions are already waiting; retry later")));
    } else if (deadline <= absl::Now()) {
      result = Full(absl::ResourceExhaustedError(
          absl::StrCat("the learner's queue is full (", queue_.size(), " of ",
                       options_.capacity_groups, " groups); retry later")));
    } else {
      ticket = next_ticket_++;
      held_[source] += n;
      waiters_.push_back(Waiter{ticket, std::move(groups), deadline, std::move(done), absl::Now()});
      ++waiters_generation_;
      return ticket;  // `done` runs later
    }
  }
  done(result);
  return 0;
}

AdmissionResult GroupQueue::Push(std::vector<QueuedGroup> groups, absl::Time deadline) {
  absl::Notification finished;
  AdmissionResult result = AdmissionResult::Accepted();
  PushAsync(std::move(groups), deadline, [&](const AdmissionResult& r) {
    result = r;
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

void GroupQueue::CancelPush(uint64_t ticket) {
  PushDone done;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [&](const Waiter& w) { return w.ticket == ticket; });
    if (it == waiters_.end()) return;
    done = std::move(it->done);
    ReleasePushLocked(it->groups);
    waiters_.erase(it);
    ++waiters_generation_;
  }
  done(AdmissionResult::Refused(
      AdmissionOutcome::kCancelled,
      absl::CancelledError("the submission was cancelled while waiting for queue room")));
}

bool GroupQueue::StepShortLocked() const {
  return static_cast<int64_t>(queue_.size()) < options_.step_groups;
}

bool GroupQueue::FitsLocked(int64_t n) const {
  return static_cast<int64_t>(queue_.size()) + n <= options_.capacity_groups;
}

void GroupQueue::PassOverLocked(std::list<Waiter>::iterator end) {
  for (auto it = waiters_.begin(); it != end; ++it) {
    if (!it->passed) ++passed_over_;
    it->passed = true;
  }
}

void GroupQueue::AdmitWaitersLocked(std::vector<Completion>* done) {
  bool skipped = false;  // a waiting push before `it` was passed over
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& w = *it;
    const std::string source = SourceOf(w.groups);
    const int64_t held = static_cast<int64_t>(w.groups.size());
    // Another push of its id may have been admitted while it waited.
    if (AdmissionResult r = AdmitIdLocked(&w.groups); !r.accepted()) {
      ReleaseLocked(source, held);
      done->emplace_back(std::move(w.done), std::move(r));
      it = waiters_.erase(it);
      ++waiters_generation_;
      continue;
    }
    ReleaseLocked(source,
                  held - static_cast<int64_t>(w.groups.size()));  // a resend's trained groups
    if (!FitsLocked(static_cast<int64_t>(w.groups.size())) || (skipped && !StepShortLocked())) {
      // While a step is short the trainer frees no room: pass it over.
      if (!StepShortLocked()) break;  // FIFO again
      skipped = true;
      ++it;
      continue;
    }
    PassOverLocked(it);
    Enqueue(&w.groups);
    done->emplace_back(std::move(w.done), AdmissionResult::Accepted());
    it = waiters_.erase(it);
    ++waiters_generation_;
  }
}

std::vector<QueuedGroup> GroupQueue::Pop(int64_t count, absl::Time deadline, int64_t min_count) {
  std::vector<QueuedGroup> out;
  std::vector<Completion> done;
  if (min_count <= 0 || min_count > count) min_count = count;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int64_t>(queue_.size()) >= count || closed_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    const int64_t n = std::min<int64_t>(count, static_cast<int64_t>(queue_.size()));
    if (n >= min_count || closed_) {
      out.reserve(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        out.push_back(std::move(queue_.front()));
        queue_.pop_front();
        ReleaseLocked(out.back().source, 1);
      }
      popped_groups_ += n;
      AdmitWaitersLocked(&done);
    }
  }
  RunAll(&done);
  return out;
}

std::vector<QueuedGroup> GroupQueue::RemoveIf(const std::function<bool(const QueuedGroup&)>& drop) {
  std::vector<QueuedGroup> removed;
  std::vector<Completion> done;
  {
    absl::MutexLock lock(&mu_);
    size_t before = 0;
    do {  // until the waiting pushes admitted bring nothing to remove
      before = removed.size();
      std::deque<QueuedGroup> kept;
      for (QueuedGroup& g : queue_) {
        if (drop(g)) {
          ReleaseLocked(g.source, 1);
          removed.push_back(std::move(g));
        } else {
          kept.push_back(std::move(g));
        }
      }
      queue_.swap(kept);
      AdmitWaitersLocked(&done);
    } while (removed.size() != before);
    removed_groups_ += static_cast<int64_t>(removed.size());
    for (const QueuedGroup& g : removed) {
      ledger_.Resolve(g.source, g.batch_id, g.batch_index, g.arrival_version, /*trained=*/false);
    }
  }
  RunAll(&done);
  return removed;
}

void GroupQueue::Close() {
  std::vector<Completion> done;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (Waiter& w : waiters_) {
      ReleasePushLocked(w.groups);
      done.emplace_back(
          std::move(w.done),
          AdmissionResult::Refused(AdmissionOutcome::kUnavailable,
                                   absl::UnavailableError("the learner is shutting down; the batch "
                                                          "was not queued")));
    }
    waiters_.clear();
  }
  RunAll(&done);
}

void GroupQueue::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!closed_) {
    absl::Time next = absl::InfiniteFuture();
    for (const Waiter& w : waiters_) next = std::min(next, w.deadline);
    // Wakes on the earliest deadline, or when the waiter list or closed_
    // changes.
    const uint64_t seen = waiters_generation_;
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || waiters_generation_ != seen;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
    std::vector<Completion> done;
    const absl::Time now = absl::Now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline <= now) {
        ReleasePushLocked(it->groups);
        done.emplace_back(std::move(it->done), Full(DeadlinePassedLocked(*it)));
        it = waiters_.erase(it);
        ++waiters_generation_;
      } else {
        ++it;
      }
    }
    if (!done.empty()) {
      mu_.Unlock();
      RunAll(&done);
      mu_.Lock();
    }
  }
}

std::vector<GroupRef> RefsOf(const std::vector<QueuedGroup>& groups) {
  std::vector<GroupRef> out;
  out.reserve(groups.size());
  for (const QueuedGroup& g : groups) {
    out.push_back({g.batch_id, g.batch_index, g.arrival_version, g.source});
  }
  return out;
}

void GroupQueue::Resolve(const std::vector<GroupRef>& groups, bool trained) {
  absl::MutexLock lock(&mu_);
  for (const GroupRef& g : groups) {
    ledger_.Resolve(g.source, g.batch_id, g.batch_index, g.arrival_version, trained);
  }
}

std::vector<CheckpointBatch> GroupQueue::RecordedBatches() const {
  absl::MutexLock lock(&mu_);
  return ledger_.Recorded();
}

void GroupQueue::RestoreBatches(const std::vector<CheckpointBatch>& batches) {
  absl::MutexLock lock(&mu_);
  ledger_.Restore(batches);
}

uint64_t GroupQueue::TrainedThrough(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  return ledger_.TrainedThrough(version);
}

absl::Status GroupQueue::DeadlinePassedLocked(const Waiter& w) const {
  const int64_t n = static_cast<int64_t>(w.groups.size());
  // A batch at most this large fits whenever a step is short.
  const int64_t never_waits = options_.capacity_groups - options_.step_groups + 1;
  std::string why;
  if (w.passed && n > never_waits) {
    // It needs the queue nearly empty, and smaller batches kept steps going.
    why = absl::StrCat(
        "; smaller batches were queued before it to keep the steps going: batches of "
        "at most ",
        never_waits, " groups never wait for one");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the learner's queue stayed full (", queue_.size(), " of ", options_.capacity_groups,
      " groups) until the deadline; the batch needed room for ", n,
      " groups and nothing of it was queued", why));
}

int64_t GroupQueue::depth_groups() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

GroupQueueStats GroupQueue::Stats() const {
  absl::MutexLock lock(&mu_);
  GroupQueueStats s{static_cast<int64_t>(queue_.size()),
                    options_.capacity_groups,
                    static_cast<int64_t>(waiters_.size()),
                    accepted_groups_,
                    popped_groups_,
                    duplicate_batches_,
                    ledger_.size(),
                    batch_id_conflicts_,
                    removed_groups_};
  const absl::Time now = absl::Now();
  for (const Waiter& w : waiters_) {
    const int64_t n = static_cast<int64_t>(w.groups.size());
    s.waiting_groups += n;
    s.largest_waiting = std::max(s.largest_waiting, n);
    s.oldest_wait = std::max(s.oldest_wait, now - w.since);
  }
  s.passed_over = passed_over_;
  return s;
}

}  // namespace asympo::learner
