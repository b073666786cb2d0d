// The learner loop's take and commit (step_intake.h): the policy-lag drops
// before a step, each taken group's lag, and what the ledger records of a
// trained or skipped step.
#include "learner_server/admission/step_intake.h"

#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "learner_server/learner_metrics.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::RolloutBatchBuilder;

// A batch `id` of `source`: one group a first policy version (nullopt: none).
std::vector<QueuedGroup> IntakeBatch(const std::string& id, const std::string& source,
                                     const std::vector<std::optional<uint64_t>>& first) {
  v1::RolloutBatch b = RolloutBatchBuilder(static_cast<int>(first.size()), 2).Build();
  std::vector<QueuedGroup> out;
  for (size_t g = 0; g < first.size(); ++g) {
    QueuedGroup q;
    q.group = b.groups(static_cast<int>(g));
    if (first[g].has_value()) {
      for (v1::Response& r : *q.group.mutable_responses()) r.set_first_policy_version(*first[g]);
    }
    q.source = source;
    q.batch_id = id;
    q.batch_digest = "digest-" + id;
    q.batch_groups = static_cast<int32_t>(first.size());
    q.batch_index = static_cast<int32_t>(g);
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<std::string> RecordedIds(const GroupQueue& queue) {
  std::vector<std::string> out;
  for (const CheckpointBatch& b : queue.RecordedBatches()) out.push_back(b.id);
  return out;
}

class StepIntakeTest : public ::testing::Test {
 protected:
  prometheus::Registry registry_;
  PolicyLagMetrics metrics_ = RegisterPolicyLagMetrics(registry_);
  PolicyLag lag_{2, metrics_};
  GroupQueue queue_{{8, 4, 64}};
  StepIntake intake_{&queue_, &lag_};
};

// Bound 2 at version 10: "old" (version 5) is dropped before the pop, and
// the taken groups carry their sources and lags in order.
TEST_F(StepIntakeTest, TakesTheStepsGroupsWithoutThoseBehindTheBound) {
  ASSERT_OK(queue_.Push(IntakeBatch("old", "gen-a", {5}), absl::InfiniteFuture()));
  ASSERT_OK(queue_.Push(IntakeBatch("new", "gen-b", {9, std::nullopt}), absl::InfiniteFuture()));
  const TakenGroups taken = intake_.Take(2, 10, absl::Now() + absl::Milliseconds(50));
  ASSERT_EQ(taken.groups.size(), 2u);
  EXPECT_EQ(taken.version, 10u);
  EXPECT_EQ(taken.sources, (std::vector<std::string>{"gen-b", "gen-b"}));
  ASSERT_EQ(taken.lags.size(), 2u);
  EXPECT_EQ(taken.lags[0].lag, 1u);
  EXPECT_EQ(taken.lags[1].lag, std::nullopt);
  ASSERT_EQ(taken.refs.size(), 2u);
  EXPECT_EQ(taken.refs[1].batch_index, 1);
  EXPECT_EQ(metrics_.dropped.Value(), 1.0);
}

// A trained step's batches are recorded (a checkpoint keeps them) and its
// lags observed; a skipped step's are neither.
TEST_F(StepIntakeTest, RecordsATrainedStepAndNotASkippedOne) {
  ASSERT_OK(queue_.Push(IntakeBatch("a", "gen", {9}), absl::InfiniteFuture()));
  TakenGroups a = intake_.Take(1, 10, absl::Now() + absl::Milliseconds(50));
  ASSERT_EQ(a.groups.size(), 1u);
  intake_.Trained(a, /*dropped=*/{});
  EXPECT_EQ(RecordedIds(queue_), (std::vector<std::string>{"a"}));
  EXPECT_EQ(metrics_.lag.Collect().histogram.sample_count, 1u);

  ASSERT_OK(queue_.Push(IntakeBatch("b", "gen", {10}), absl::InfiniteFuture()));
  TakenGroups b = intake_.Take(1, 10, absl::Now() + absl::Milliseconds(50));
  ASSERT_EQ(b.groups.size(), 1u);
  intake_.Skipped(b);
  EXPECT_EQ(RecordedIds(queue_), (std::vector<std::string>{"a"}));
  EXPECT_EQ(metrics_.lag.Collect().histogram.sample_count, 1u);
}

// Fewer than a step's groups, queued for longer than partial_after: the
// next Take returns them as a short step; before that, none.
TEST_F(StepIntakeTest, TakesAShortStepOnceFewerGroupsWaitedPartialAfter) {
  StepIntake intake(&queue_, &lag_, absl::Milliseconds(150));
  ASSERT_OK(queue_.Push(IntakeBatch("a", "gen", {9, 9, 9}), absl::InfiniteFuture()));
  EXPECT_TRUE(intake.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
  EXPECT_TRUE(intake.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
  absl::SleepFor(absl::Milliseconds(200));
  const TakenGroups taken = intake.Take(4, 10, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(taken.groups.size(), 3u);
  EXPECT_TRUE(taken.short_step);
  // The timer starts again: a full step is not short, and a lone group
  // waits again.
  ASSERT_OK(queue_.Push(IntakeBatch("b", "gen", {10, 10, 10, 10, 10}), absl::InfiniteFuture()));
  const TakenGroups full = intake.Take(4, 10, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(full.groups.size(), 4u);
  EXPECT_FALSE(full.short_step);
  EXPECT_TRUE(intake.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
}

// Fewer than a step's groups queued and a submission that cannot fit
// waiting for room: only a step frees it, so the short step comes after
// kBlockedFor, not partial_after.
TEST_F(StepIntakeTest, ASubmissionWaitingForRoomBringsTheShortStepSooner) {
  StepIntake intake(&queue_, &lag_, absl::Hours(1));
  ASSERT_OK(queue_.Push(IntakeBatch("a", "gen", {9, 9, 9, 9, 9, 9, 9}), absl::InfiniteFuture()));
  EXPECT_EQ(intake.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.size(), 4u);
  absl::Notification admitted;  // 3 queued + 6 > 8: it waits for a step
  queue_.PushAsync(IntakeBatch("big", "gen", {9, 9, 9, 9, 9, 9}), absl::InfiniteFuture(),
                   [&](const AdmissionResult&) { admitted.Notify(); });
  EXPECT_TRUE(intake.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
  absl::SleepFor(kBlockedFor + absl::Milliseconds(100));
  EXPECT_TRUE(intake.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
  const TakenGroups taken = intake.Take(4, 10, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(taken.groups.size(), 3u);
  EXPECT_TRUE(taken.short_step);
  EXPECT_TRUE(admitted.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

// partial_after zero: steps are always whole.
TEST_F(StepIntakeTest, WithoutPartialAfterFewerGroupsWaitForAWholeStep) {
  ASSERT_OK(queue_.Push(IntakeBatch("a", "gen", {9, 9, 9}), absl::InfiniteFuture()));
  EXPECT_TRUE(intake_.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(intake_.Take(4, 10, absl::Now() + absl::Milliseconds(20)).groups.empty());
  EXPECT_EQ(queue_.Stats().depth_groups, 3);
}

}  // namespace
}  // namespace asympo::learner
