#include "learner_server/group_queue.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"

namespace asympo::learner {
namespace {

using ::testing::HasSubstr;

std::vector<QueuedGroup> Groups(int n, const std::string& tag) {
  std::vector<QueuedGroup> out(n);
  for (int i = 0; i < n; ++i) out[i].group.set_prompt_id(tag + std::to_string(i));
  return out;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(GroupQueueTest, PopsWholeBatchesInArrivalOrder) {
  GroupQueue q({/*capacity_groups=*/8, /*max_waiting_pushes=*/4});
  ASSERT_TRUE(q.Push(Groups(2, "a"), Soon()).ok());
  ASSERT_TRUE(q.Push(Groups(3, "b"), Soon()).ok());
  const auto out = q.Pop(4, Soon());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].group.prompt_id(), "a0");
  EXPECT_EQ(out[2].group.prompt_id(), "b0");
  EXPECT_EQ(q.Stats().depth_groups, 1);
}

TEST(GroupQueueTest, AFullQueueHoldsThePushUntilRoomThenAdmitsItWhole) {
  GroupQueue q({4, 4});
  ASSERT_TRUE(q.Push(Groups(3, "a"), Soon()).ok());
  absl::Notification admitted;
  absl::Status status = absl::UnknownError("not run");
  q.PushAsync(Groups(2, "b"), Soon(), [&](const absl::Status& s) {
    status = s;
    admitted.Notify();
  });
  EXPECT_FALSE(admitted.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_EQ(q.Stats().waiting_pushes, 1);
  EXPECT_EQ(q.Pop(1, Soon()).size(), 1u);  // frees room for both b groups
  ASSERT_TRUE(admitted.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(q.Stats().depth_groups, 4);
}

TEST(GroupQueueTest, AWaitingPushFailsWithResourceExhaustedAtItsDeadline) {
  GroupQueue q({2, 4});
  ASSERT_TRUE(q.Push(Groups(2, "a"), Soon()).ok());
  const absl::Time start = absl::Now();
  const absl::Status s = q.Push(Groups(1, "b"), absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("stayed full"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  // Nothing of it was queued; what was accepted is still there.
  EXPECT_EQ(q.Stats().depth_groups, 2);
  EXPECT_EQ(q.Stats().accepted_groups, 2);
}

TEST(GroupQueueTest, RefusesOversizeBatchesAndTooManyWaiters) {
  GroupQueue q({3, 1});
  EXPECT_EQ(q.Push(Groups(4, "x"), Soon()).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(q.Push(Groups(3, "a"), Soon()).ok());
  absl::Notification first;
  q.PushAsync(Groups(1, "b"), Soon(), [&](const absl::Status&) { first.Notify(); });
  const absl::Status second = q.Push(Groups(1, "c"), Soon());
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(second.message()), HasSubstr("already waiting"));
  q.Close();
  EXPECT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST(GroupQueueTest, CancelWithdrawsAWaitingPush) {
  GroupQueue q({1, 4});
  ASSERT_TRUE(q.Push(Groups(1, "a"), Soon()).ok());
  absl::Status status;
  absl::Notification done;
  const uint64_t ticket = q.PushAsync(Groups(1, "b"), Soon(), [&](const absl::Status& s) {
    status = s;
    done.Notify();
  });
  ASSERT_NE(ticket, 0u);
  q.CancelPush(ticket);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(q.Pop(1, Soon()).size(), 1u);
  EXPECT_EQ(q.Stats().depth_groups, 0);
}

TEST(GroupQueueTest, CloseFailsWaitersAndDrainsWhatWasAccepted) {
  GroupQueue q({2, 4});
  ASSERT_TRUE(q.Push(Groups(2, "a"), Soon()).ok());
  absl::Status status;
  absl::Notification done;
  q.PushAsync(Groups(1, "b"), Soon(), [&](const absl::Status& s) {
    status = s;
    done.Notify();
  });
  q.Close();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(q.Push(Groups(1, "c"), Soon()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(q.Pop(5, Soon()).size(), 2u);  // closed: returns what is left
}

TEST(GroupQueueTest, ConcurrentProducersAndAConsumerLoseNothing) {
  GroupQueue q({16, 64});
  constexpr int kProducers = 4, kBatches = 200;
  std::atomic<int> accepted{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int b = 0; b < kBatches; ++b) {
        if (q.Push(Groups(1 + (b % 3), "p" + std::to_string(p)), Soon()).ok()) {
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

}  // namespace
}  // namespace asympo::learner
