// The queue and the trainer's steps (group_queue.h, "No head-of-line
// deadlock"): a waiting push that does not fit never holds up the pushes
// behind it while the trainer waits for a step's groups, and once a step's
// worth is queued the order is FIFO again.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "learner_server/admission/group_queue.h"
#include "tests/testing/queued_groups.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::Soon;
using ::asympo::testing::StatusIs;
using ::asympo::testing::TaggedGroups;

GroupQueueOptions StepQueueOptions(int64_t capacity, int64_t step) {
  GroupQueueOptions o;
  o.capacity_groups = capacity;
  o.max_waiting_pushes = 8;
  o.step_groups = step;
  return o;
}

// A waiting push, and its answer once it has one.
struct Pending {
  absl::Notification done;
  AdmissionResult result = AdmissionResult::Accepted();
  GroupQueue::PushDone Callback() {
    return [this](const AdmissionResult& r) {
      result = r;
      done.Notify();
    };
  }
};

// The learner's defaults (steps of 8, capacity 64, batches of up to 64): 5
// groups queued, a batch of 64 that cannot fit, then 3 that complete a
// step. The 3 are queued at once; the step pops 8, and the 64 fit then.
TEST(GroupQueueStepsTest, ABatchThatDoesNotFitDoesNotHoldUpOneThatCompletesAStep) {
  GroupQueue q(StepQueueOptions(64, 8));
  ASSERT_OK(q.Push(TaggedGroups(5, "a"), Soon()));
  Pending big;
  q.PushAsync(TaggedGroups(64, "big"), Soon(), big.Callback());
  EXPECT_FALSE(big.done.HasBeenNotified());
  const AdmissionResult small = q.Push(TaggedGroups(3, "c"), absl::Now() + absl::Milliseconds(500));
  ASSERT_OK(small.status());
  EXPECT_EQ(q.Stats().depth_groups, 8);
  EXPECT_EQ(q.Stats().passed_over, 1);
  const std::vector<QueuedGroup> step = q.Pop(8, Soon());
  ASSERT_EQ(step.size(), 8u);
  EXPECT_EQ(step[5].group.prompt_id(), "c0");
  ASSERT_TRUE(big.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(big.result.status());
  EXPECT_EQ(q.Stats().depth_groups, 64);
}

// The same with both waiting: the waiting small one is admitted past the
// big one as soon as it can complete the step's groups.
TEST(GroupQueueStepsTest, AWaitingPushThatFitsIsAdmittedPastOneThatDoesNot) {
  GroupQueue q(StepQueueOptions(8, 4));
  ASSERT_OK(q.Push(TaggedGroups(7, "a"), Soon()));
  Pending big, small;
  q.PushAsync(TaggedGroups(8, "big"), Soon(), big.Callback());
  q.PushAsync(TaggedGroups(2, "small"), Soon(), small.Callback());  // 7 + 2 > 8: waits
  EXPECT_EQ(q.Stats().waiting_pushes, 2);
  ASSERT_EQ(q.Pop(4, Soon()).size(), 4u);  // 3 left, a step short: small passes big
  ASSERT_TRUE(small.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(small.result.status());
  EXPECT_FALSE(big.done.HasBeenNotified());
  ASSERT_EQ(q.Pop(4, Soon()).size(), 4u);  // 1 left
  ASSERT_EQ(q.Pop(1, Soon()).size(), 1u);  // empty: big fits
  ASSERT_TRUE(big.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(big.result.status());
}

// Once a step's worth is queued the trainer frees room by itself: a later
// push waits behind the earlier one (FIFO), so a large batch gets its turn.
TEST(GroupQueueStepsTest, WithAStepsWorthQueuedTheOrderIsFifo) {
  GroupQueue q(StepQueueOptions(8, 2));
  ASSERT_OK(q.Push(TaggedGroups(4, "a"), Soon()));
  Pending big;
  q.PushAsync(TaggedGroups(6, "big"), Soon(), big.Callback());
  const AdmissionResult small = q.Push(TaggedGroups(1, "c"), absl::Now() + absl::Milliseconds(100));
  EXPECT_THAT(small.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_EQ(q.Pop(2, Soon()).size(), 2u);  // 2 left: big fits
  ASSERT_TRUE(big.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(big.result.status());
  EXPECT_EQ(q.Stats().passed_over, 0);
}

// A passed-over push that reaches its deadline says why, and what batch size
// never waits for one.
TEST(GroupQueueStepsTest, APassedOverPushThatTimesOutSaysWhatSizeNeverWaits) {
  GroupQueue q(StepQueueOptions(64, 8));
  ASSERT_OK(q.Push(TaggedGroups(5, "a"), Soon()));
  Pending big;
  q.PushAsync(TaggedGroups(64, "big"), absl::Now() + absl::Milliseconds(300), big.Callback());
  ASSERT_OK(q.Push(TaggedGroups(1, "c"), Soon()));
  const GroupQueueStats s = q.Stats();
  EXPECT_EQ(s.waiting_groups, 64);
  EXPECT_EQ(s.largest_waiting, 64);
  EXPECT_GT(s.oldest_wait, absl::ZeroDuration());
  ASSERT_TRUE(big.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_THAT(big.result.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                            "batches of at most 57 groups never wait for one"));
  EXPECT_EQ(q.Stats().oldest_wait, absl::ZeroDuration());
}

// A short pop: fewer than asked, but at least min_count, at the deadline.
TEST(GroupQueueStepsTest, PopTakesFewerThanAskedWhenMinCountAllows) {
  GroupQueue q(StepQueueOptions(8, 4));
  ASSERT_OK(q.Push(TaggedGroups(3, "a"), Soon()));
  EXPECT_TRUE(q.Pop(4, absl::Now() + absl::Milliseconds(20)).empty());
  EXPECT_EQ(q.Pop(4, absl::Now() + absl::Milliseconds(20), 1).size(), 3u);
  EXPECT_TRUE(q.Pop(4, absl::Now() + absl::Milliseconds(20), 1).empty());
}

}  // namespace
}  // namespace asympo::learner
