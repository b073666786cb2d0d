#include "learner_server/admission/group_queue.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "tests/testing/queued_groups.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::Soon;
using ::asympo::testing::StatusIs;
using ::asympo::testing::TaggedGroups;
using ::testing::HasSubstr;

TEST(GroupQueueTest, PopsWholeBatchesInArrivalOrder) {
  GroupQueue q({/*capacity_groups=*/8, /*max_waiting_pushes=*/4});
  ASSERT_OK(q.Push(TaggedGroups(2, "a"), Soon()));
  ASSERT_OK(q.Push(TaggedGroups(3, "b"), Soon()));
  const auto out = q.Pop(4, Soon());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].group.prompt_id(), "a0");
  EXPECT_EQ(out[2].group.prompt_id(), "b0");
  EXPECT_EQ(q.Stats().depth_groups, 1);
}

TEST(GroupQueueTest, AFullQueueHoldsThePushUntilRoomThenAdmitsItWhole) {
  GroupQueue q({4, 4});
  ASSERT_OK(q.Push(TaggedGroups(3, "a"), Soon()));
  absl::Notification admitted;
  absl::Status status = absl::UnknownError("not run");
  q.PushAsync(TaggedGroups(2, "b"), Soon(), [&](const AdmissionResult& s) {
    status = s.status();
    admitted.Notify();
  });
  EXPECT_FALSE(admitted.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_EQ(q.Stats().waiting_pushes, 1);
  EXPECT_EQ(q.Pop(1, Soon()).size(), 1u);  // frees room for both b groups
  ASSERT_TRUE(admitted.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(status);
  EXPECT_EQ(q.Stats().depth_groups, 4);
}

TEST(GroupQueueTest, AWaitingPushFailsWithResourceExhaustedAtItsDeadline) {
  GroupQueue q({2, 4});
  ASSERT_OK(q.Push(TaggedGroups(2, "a"), Soon()));
  const absl::Time start = absl::Now();
  const AdmissionResult s = q.Push(TaggedGroups(1, "b"), absl::Now() + absl::Milliseconds(200));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, "stayed full"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  // Nothing of it was queued; what was accepted is still there.
  EXPECT_EQ(q.Stats().depth_groups, 2);
  EXPECT_EQ(q.Stats().accepted_groups, 2);
}

TEST(GroupQueueTest, RefusesOversizeBatchesAndTooManyWaiters) {
  GroupQueue q({3, 1});
  EXPECT_THAT(q.Push(TaggedGroups(4, "x"), Soon()), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(q.Push(TaggedGroups(3, "a"), Soon()));
  absl::Notification first;
  q.PushAsync(TaggedGroups(1, "b"), Soon(), [&](const AdmissionResult&) { first.Notify(); });
  const AdmissionResult second = q.Push(TaggedGroups(1, "c"), Soon());
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kResourceExhausted, "already waiting"));
  q.Close();
  EXPECT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST(GroupQueueTest, CancelWithdrawsAWaitingPush) {
  GroupQueue q({1, 4});
  ASSERT_OK(q.Push(TaggedGroups(1, "a"), Soon()));
  absl::Status status;
  absl::Notification done;
  const uint64_t ticket = q.PushAsync(TaggedGroups(1, "b"), Soon(), [&](const AdmissionResult& s) {
    status = s.status();
    done.Notify();
  });
  ASSERT_NE(ticket, 0u);
  q.CancelPush(ticket);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(q.Pop(1, Soon()).size(), 1u);
  EXPECT_EQ(q.Stats().depth_groups, 0);
}

TEST(GroupQueueTest, CloseFailsWaitersAndDrainsWhatWasAccepted) {
  GroupQueue q({2, 4});
  ASSERT_OK(q.Push(TaggedGroups(2, "a"), Soon()));
  absl::Status status;
  absl::Notification done;
  q.PushAsync(TaggedGroups(1, "b"), Soon(), [&](const AdmissionResult& s) {
    status = s.status();
    done.Notify();
  });
  q.Close();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(q.Push(TaggedGroups(1, "c"), Soon()), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(q.Pop(5, Soon()).size(), 2u);  // closed: returns what is left
}

// RemoveIf takes out exactly the groups it is told to, keeps the others in
// order, and the room it frees admits a waiting push, whose groups it
// checks too.
TEST(GroupQueueTest, RemoveIfTakesOutMatchingGroupsAndAdmitsWaitersChecked) {
  GroupQueue q({4, 4});
  ASSERT_OK(q.Push(TaggedGroups(3, "old"), Soon()));
  ASSERT_OK(q.Push(TaggedGroups(1, "new"), Soon()));
  absl::Notification admitted;
  q.PushAsync(TaggedGroups(3, "w"), Soon(), [&](const AdmissionResult& s) {
    EXPECT_OK(s);
    admitted.Notify();
  });
  EXPECT_EQ(q.Stats().waiting_pushes, 1);
  // "old*" go, and of the waiting push admitted into their room, "w1".
  const std::vector<QueuedGroup> removed = q.RemoveIf([](const QueuedGroup& g) {
    return g.group.prompt_id().rfind("old", 0) == 0 || g.group.prompt_id() == "w1";
  });
  ASSERT_TRUE(admitted.WaitForNotificationWithTimeout(absl::Seconds(5)));
  std::vector<std::string> ids;
  for (const QueuedGroup& g : removed) ids.push_back(g.group.prompt_id());
  EXPECT_EQ(ids, (std::vector<std::string>{"old0", "old1", "old2", "w1"}));
  const GroupQueueStats stats = q.Stats();
  EXPECT_EQ(stats.removed_groups, 4);
  EXPECT_EQ(stats.depth_groups, 3);
  EXPECT_EQ(stats.waiting_pushes, 0);
  ids.clear();
  for (const QueuedGroup& g : q.Pop(3, Soon())) ids.push_back(g.group.prompt_id());
  EXPECT_EQ(ids, (std::vector<std::string>{"new0", "w0", "w2"}));
  EXPECT_TRUE(q.RemoveIf([](const QueuedGroup&) { return true; }).empty());
}

TEST(GroupQueueTest, ConcurrentProducersAndAConsumerLoseNothing) {
  GroupQueue q({16, 64});
  constexpr int kProducers = 4, kBatches = 200;
  std::atomic<int> accepted{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int b = 0; b < kBatches; ++b) {
        if (q.Push(TaggedGroups(1 + (b % 3), "p" + std::to_string(p)), Soon()).accepted()) {
          accepted += 1 + (b % 3);
        }
      }
    });
  }
  int popped = 0;
  std::atomic<bool> producers_done{false};
  std::thread consumer([&] {
    while (!(producers_done.load() && q.Stats().depth_groups == 0)) {
      const int64_t want = std::clamp<int64_t>(q.Stats().depth_groups, 1, 5);
      popped += static_cast<int>(q.Pop(want, absl::Now() + absl::Milliseconds(20)).size());
    }
  });
  for (auto& t : producers) t.join();
  producers_done = true;
  consumer.join();
  const GroupQueueStats s = q.Stats();
  EXPECT_EQ(s.accepted_groups, accepted.load());
  EXPECT_EQ(s.accepted_groups, popped + s.depth_groups);
  EXPECT_EQ(accepted.load(), kProducers * (kBatches / 3 * 6 + (kBatches % 3 == 2 ? 3 : 1)));
}

// Groups of one batch with id `id`.
// A batch as LearnerService::Prepare makes it: `n` groups named after
// `tag`, under `id`, with their digest, count and indices, arrived at
// `version`.
std::vector<QueuedGroup> PreparedBatch(int n, const std::string& tag, const std::string& id,
                                       uint64_t version = 0) {
  std::vector<QueuedGroup> out = TaggedGroups(n, tag);
  google::protobuf::RepeatedPtrField<v1::PromptGroup> groups;
  for (const QueuedGroup& g : out) *groups.Add() = g.group;
  const std::string digest = BatchDigest(groups);
  for (int i = 0; i < n; ++i) {
    out[i].batch_id = id;
    out[i].batch_digest = digest;
    out[i].batch_groups = n;
    out[i].batch_index = i;
    out[i].arrival_version = version;
  }
  return out;
}

std::vector<std::string> BatchIds(const std::vector<CheckpointBatch>& batches) {
  std::vector<std::string> out;
  for (const CheckpointBatch& b : batches) out.push_back(b.id);
  return out;
}

TEST(GroupQueueBatchIdTest, ASecondPushOfAnAcceptedIdIsAnsweredAlreadyExistsAndNotQueued) {
  GroupQueue q({8, 4});
  ASSERT_OK(q.Push(PreparedBatch(2, "a", "id-1"), Soon()));
  const AdmissionResult again = q.Push(PreparedBatch(2, "a", "id-1"), Soon());
  EXPECT_THAT(again,
              StatusIs(absl::StatusCode::kAlreadyExists, "batch_id \"id-1\" was accepted before"));
  EXPECT_OK(q.Push(PreparedBatch(1, "b", "id-2"), Soon()));
  EXPECT_OK(q.Push(TaggedGroups(1, "no-id"), Soon()));  // no id: no deduplication
  EXPECT_OK(q.Push(TaggedGroups(1, "no-id"), Soon()));
  const GroupQueueStats s = q.Stats();
  EXPECT_EQ(s.depth_groups, 5);
  EXPECT_EQ(s.accepted_groups, 5);
  EXPECT_EQ(s.duplicate_batches, 1);
  EXPECT_EQ(s.batch_ids, 2);
}

TEST(GroupQueueBatchIdTest, ADuplicateIsAnsweredAtOnceEvenWhenTheQueueIsFull) {
  GroupQueue q({2, 4});
  ASSERT_OK(q.Push(PreparedBatch(2, "a", "full"), Soon()));
  const absl::Time start = absl::Now();
  EXPECT_THAT(q.Push(PreparedBatch(2, "a", "full"), Soon()),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(GroupQueueBatchIdTest, TwoWaitingPushesOfOneIdAreQueuedOnce) {
  GroupQueue q({2, 4});
  ASSERT_OK(q.Push(TaggedGroups(2, "x"), Soon()));
  std::vector<absl::Status> status(2);
  absl::Notification done[2];
  for (int i = 0; i < 2; ++i) {
    q.PushAsync(PreparedBatch(2, "w", "twin"), Soon(), [&, i](const AdmissionResult& s) {
      status[i] = s.status();
      done[i].Notify();
    });
  }
  EXPECT_EQ(q.Stats().waiting_pushes, 2);
  EXPECT_EQ(q.Pop(2, Soon()).size(), 2u);
  ASSERT_TRUE(done[0].WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(done[1].WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(status[0]);
  EXPECT_THAT(status[1], StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(q.Stats().depth_groups, 2);
  EXPECT_EQ(q.Stats().accepted_groups, 4);
}

TEST(GroupQueueBatchIdTest, APushThatTimedOutIsNotRememberedSoItsRetryIsQueued) {
  GroupQueue q({1, 4});
  ASSERT_OK(q.Push(TaggedGroups(1, "x"), Soon()));
  EXPECT_THAT(q.Push(PreparedBatch(1, "r", "late"), absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(q.Pop(1, Soon()).size(), 1u);
  EXPECT_OK(q.Push(PreparedBatch(1, "r", "late"), Soon()));
  EXPECT_EQ(q.Stats().duplicate_batches, 0);
}

TEST(GroupQueueBatchIdTest, TrainedIdsAreWhatACheckpointKeepsAndRestoreRemembersThem) {
  GroupQueue q({8, 4});
  ASSERT_OK(q.Push(PreparedBatch(1, "a", "a"), Soon()));
  ASSERT_OK(q.Push(PreparedBatch(2, "b", "b"), Soon()));
  ASSERT_OK(q.Push(PreparedBatch(1, "c", "c"), Soon()));
  const std::vector<QueuedGroup> step = q.Pop(2, Soon());  // a and half of b
  EXPECT_TRUE(q.RecordedBatches().empty());                // popped is not trained
  q.Resolve(RefsOf(step), /*trained=*/true);
  const std::vector<CheckpointBatch> recorded = q.RecordedBatches();
  EXPECT_EQ(BatchIds(recorded), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(recorded[1].groups, 2);
  EXPECT_EQ(recorded[1].trained, (std::vector<int32_t>{0}));
  // A restarted queue refuses the trained batch (a duplicate its
  // checkpoint records), queues the untrained one and, of the half-trained
  // one, only the group no step trained.
  GroupQueue restarted({8, 4});
  restarted.RestoreBatches(recorded);
  const AdmissionResult a_again = restarted.Push(PreparedBatch(1, "a", "a"), Soon());
  EXPECT_TRUE((a_again).recorded()) << a_again;
  EXPECT_OK(restarted.Push(PreparedBatch(2, "b", "b"), Soon()));
  EXPECT_OK(restarted.Push(PreparedBatch(1, "c", "c"), Soon()));
  const std::vector<QueuedGroup> queued = restarted.Pop(2, Soon());
  ASSERT_EQ(queued.size(), 2u);
  EXPECT_EQ(queued[0].group.prompt_id(), "b1");
  EXPECT_EQ(queued[1].group.prompt_id(), "c0");
  // Sent again, the half-trained batch is now a duplicate, not recorded
  // (its second group is queued, not trained).
  const AdmissionResult b_again = restarted.Push(PreparedBatch(2, "b", "b"), Soon());
  EXPECT_TRUE((b_again.outcome() == AdmissionOutcome::kDuplicate)) << b_again;
  EXPECT_FALSE((b_again).recorded());
  restarted.Resolve(RefsOf(queued), /*trained=*/true);
  EXPECT_EQ(BatchIds(restarted.RecordedBatches()), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(restarted.RecordedBatches()[1].trained, (std::vector<int32_t>{0, 1}));
}

TEST(GroupQueueBatchIdTest, AnIdWithAnotherPayloadIsRefusedAsAConflictNotAcknowledged) {
  GroupQueue q({8, 4});
  ASSERT_OK(q.Push(PreparedBatch(2, "a", "run/0"), Soon()));
  const AdmissionResult same = q.Push(PreparedBatch(2, "a", "run/0"), Soon());
  EXPECT_TRUE((same.outcome() == AdmissionOutcome::kDuplicate)) << same;
  EXPECT_FALSE((same).recorded());  // queued, not trained
  // New data under a reused id (a generator whose counter restarted).
  const AdmissionResult other = q.Push(PreparedBatch(2, "new", "run/0"), Soon());
  EXPECT_THAT(other, StatusIs(absl::StatusCode::kAlreadyExists,
                              "batch_id \"run/0\" was accepted before with another payload"));
  EXPECT_TRUE((other.outcome() == AdmissionOutcome::kBatchIdConflict));
  EXPECT_FALSE((other.outcome() == AdmissionOutcome::kDuplicate));
  // A different group count under the id is another payload too.
  EXPECT_TRUE((q.Push(PreparedBatch(1, "a", "run/0"), Soon()).outcome() ==
               AdmissionOutcome::kBatchIdConflict));
  const GroupQueueStats s = q.Stats();
  EXPECT_EQ(s.depth_groups, 2);
  EXPECT_EQ(s.duplicate_batches, 1);
  EXPECT_EQ(s.batch_id_conflicts, 2);
  // Restored from a checkpoint, the digest still tells them apart.
  const std::vector<QueuedGroup> step = q.Pop(2, Soon());
  q.Resolve(RefsOf(step), true);
  GroupQueue restarted({8, 4});
  restarted.RestoreBatches(q.RecordedBatches());
  EXPECT_TRUE((restarted.Push(PreparedBatch(2, "new", "run/0"), Soon()).outcome() ==
               AdmissionOutcome::kBatchIdConflict));
  EXPECT_TRUE((restarted.Push(PreparedBatch(2, "a", "run/0"), Soon()).outcome() ==
               AdmissionOutcome::kDuplicate));
}

TEST(GroupQueueBatchIdTest, AnIdFromACheckpointWithoutDigestsIsADuplicateWhateverItsPayload) {
  GroupQueue q({8, 4});
  q.RestoreBatches({CheckpointBatch{"old", "", 0, {}}});
  EXPECT_TRUE(
      (q.Push(PreparedBatch(3, "x", "old"), Soon()).outcome() == AdmissionOutcome::kDuplicate));
  EXPECT_EQ(BatchIds(q.RecordedBatches()), std::vector<std::string>{"old"});
}

// `batch` as pushed by `principal`.
std::vector<QueuedGroup> From(const std::string& principal, std::vector<QueuedGroup> batch) {
  for (QueuedGroup& g : batch) g.source = principal;
  return batch;
}

// Batch ids are one namespace per principal: another principal's push
// under a known id neither takes it (the owner's retry is still a
// duplicate, its new data still its own) nor learns from it (a push of the
// same payload is queued as its own, not answered "duplicate").
TEST(GroupQueueBatchIdTest, BatchIdsAreOneNamespacePerPrincipal) {
  GroupQueue q({16, 4});
  ASSERT_OK(q.Push(From("mallory", PreparedBatch(2, "junk", "submit/file/0")), Soon()));
  // The owner's real payload under the id mallory took first is accepted.
  ASSERT_OK(q.Push(From("alice", PreparedBatch(2, "real", "submit/file/0")), Soon()));
  EXPECT_TRUE((q.Push(From("alice", PreparedBatch(2, "real", "submit/file/0")), Soon()).outcome() ==
               AdmissionOutcome::kDuplicate));
  // No oracle: mallory's copy of alice's payload is mallory's new batch.
  const AdmissionResult probe =
      q.Push(From("mallory", PreparedBatch(2, "real", "alice/1")), Soon());
  EXPECT_TRUE(probe.accepted()) << probe;
  ASSERT_OK(q.Push(From("alice", PreparedBatch(1, "more", "alice/1")), Soon()));
  EXPECT_EQ(q.Stats().depth_groups, 7);
  // A checkpoint keeps the principal of each batch, and a restart tells
  // them apart too.
  q.Resolve(RefsOf(q.Pop(7, Soon())), /*trained=*/true);
  const std::vector<CheckpointBatch> recorded = q.RecordedBatches();
  ASSERT_EQ(recorded.size(), 4u);
  EXPECT_EQ(recorded[0].principal, std::optional<std::string>("mallory"));
  EXPECT_EQ(recorded[1].principal, std::optional<std::string>("alice"));
  GroupQueue restarted({16, 4});
  restarted.RestoreBatches(recorded);
  EXPECT_TRUE(
      (restarted.Push(From("alice", PreparedBatch(2, "real", "submit/file/0")), Soon()).outcome() ==
       AdmissionOutcome::kDuplicate));
  EXPECT_TRUE(
      (restarted.Push(From("bob", PreparedBatch(2, "real", "submit/file/0")), Soon()).accepted()));
}

// A checkpoint written before batches named their principal: its ids match
// a push of any principal, so no batch is trained twice across the upgrade.
TEST(GroupQueueBatchIdTest, AnIdFromACheckpointWithoutPrincipalsMatchesAnyPrincipal) {
  GroupQueue first({8, 4});
  ASSERT_OK(first.Push(From("alice", PreparedBatch(2, "a", "old/0")), Soon()));
  first.Resolve(RefsOf(first.Pop(1, Soon())), /*trained=*/true);
  std::vector<CheckpointBatch> recorded = first.RecordedBatches();
  ASSERT_EQ(recorded.size(), 1u);
  recorded[0].principal.reset();  // as an older checkpoint has it
  GroupQueue q({8, 4});
  q.RestoreBatches(recorded);
  const AdmissionResult resend = q.Push(From("alice", PreparedBatch(2, "a", "old/0")), Soon());
  ASSERT_TRUE(resend.accepted()) << resend;  // the untrained group only
  EXPECT_EQ(q.Stats().depth_groups, 1);
  EXPECT_TRUE((q.Push(From("bob", PreparedBatch(2, "a", "old/0")), Soon()).outcome() ==
               AdmissionOutcome::kDuplicate));
  q.Resolve(RefsOf(q.Pop(1, Soon())), /*trained=*/true);
  ASSERT_EQ(q.RecordedBatches().size(), 1u);
  EXPECT_EQ(q.RecordedBatches()[0].trained, (std::vector<int32_t>{0, 1}));
  EXPECT_FALSE(q.RecordedBatches()[0].principal.has_value());
}

TEST(GroupQueueBatchIdTest, TrainedThroughIsTheOldestUnresolvedGroupsVersion) {
  GroupQueue q({8, 4});
  // Nothing pending: all below 3, not 3 itself (a batch answered at 3 after
  // this call would be counted in).
  EXPECT_EQ(q.TrainedThrough(3), 3u);
  ASSERT_OK(q.Push(PreparedBatch(2, "a", "a", 3), Soon()));
  ASSERT_OK(q.Push(PreparedBatch(1, "b", "b", 5), Soon()));
  ASSERT_OK(q.Push(TaggedGroups(1, "no-id"), Soon()));  // arrived at 0, no id
  EXPECT_EQ(q.TrainedThrough(5), 0u);
  std::vector<QueuedGroup> step = q.Pop(2, Soon());  // both of a
  q.Resolve(RefsOf(step), true);
  EXPECT_EQ(q.TrainedThrough(6), 0u);          // the id-less group still waits
  step = q.Pop(1, Soon());                     // b
  q.Resolve(RefsOf(step), /*trained=*/false);  // a skipped step resolves too
  EXPECT_EQ(q.TrainedThrough(7), 0u);
  // Dropped (the policy-lag bound) is resolved as well.
  EXPECT_EQ(q.RemoveIf([](const QueuedGroup&) { return true; }).size(), 1u);
  EXPECT_EQ(q.TrainedThrough(7), 7u);
  EXPECT_EQ(BatchIds(q.RecordedBatches()), std::vector<std::string>{"a"});  // b was never trained
}

TEST(GroupQueueBatchIdTest, TheWindowForgetsTheOldestIds) {
  GroupQueueOptions o;
  o.capacity_groups = 8;
  o.batch_id_window = 3;
  GroupQueue q(o);
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(q.Push(PreparedBatch(1, "g", "id" + std::to_string(i)), Soon()));
    q.Resolve(RefsOf(q.Pop(1, Soon())), true);
  }
  EXPECT_EQ(q.Stats().batch_ids, 3);
  EXPECT_EQ(BatchIds(q.RecordedBatches()), (std::vector<std::string>{"id2", "id3", "id4"}));
  EXPECT_OK(q.Push(PreparedBatch(1, "g", "id0"), Soon()));  // forgotten
  EXPECT_THAT(q.Push(PreparedBatch(1, "g", "id4"), Soon()),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

}  // namespace
}  // namespace asympo::learner
