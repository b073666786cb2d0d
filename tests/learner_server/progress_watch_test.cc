#include "learner_server/progress_watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);
const absl::Duration kStall = absl::Seconds(10);

GroupQueueStats QueueStats(int64_t depth, int64_t waiting, int64_t accepted, int64_t popped) {
  GroupQueueStats q;
  q.depth_groups = depth;
  q.waiting_pushes = waiting;
  q.accepted_groups = accepted;
  q.popped_groups = popped;
  return q;
}

TEST(ProgressWatchTest, AnIdleLearnerStaysReady) {
  ProgressWatch w(kStall, 4, kT0);
  // The loop comes round every 200 ms with nothing, or less than a step,
  // queued and nothing moving: waiting for data.
  for (int i = 1; i <= 300; ++i) {
    w.CameRound(QueueStats(i < 150 ? 0 : 3, 0, 3, 0), kT0 + absl::Milliseconds(200 * i));
  }
  EXPECT_OK(w.Check(kT0 + absl::Seconds(60)));
}

TEST(ProgressWatchTest, ALoopThatDoesNotComeRoundIsNotReady) {
  ProgressWatch w(kStall, 4, kT0);
  w.CameRound(QueueStats(0, 0, 0, 0), kT0 + absl::Seconds(1));
  EXPECT_OK(w.Check(kT0 + absl::Seconds(11)));
  EXPECT_THAT(w.Check(kT0 + absl::Seconds(12)),
              StatusIs(absl::StatusCode::kUnavailable, "training loop has not come round for 11s"));
  w.CameRound(QueueStats(0, 0, 4, 4), kT0 + absl::Seconds(13));
  EXPECT_OK(w.Check(kT0 + absl::Seconds(13)));
}

TEST(ProgressWatchTest, WorkThatWaitsWhileTheQueueDoesNotMoveIsNotReady) {
  ProgressWatch w(kStall, 4, kT0);
  // A whole step queued and submissions held back, but nothing admitted or
  // taken while the loop keeps coming round.
  for (int s = 0; s <= 12; ++s) w.CameRound(QueueStats(8, 2, 8, 0), kT0 + absl::Seconds(s));
  const absl::Status s = w.Check(kT0 + absl::Seconds(12));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "the queue has not moved for 12s"));
  EXPECT_THAT(s.message(), HasSubstr("8 groups are queued (a step takes 4) and 2 submissions"));
  // A step taken: it moved.
  w.CameRound(QueueStats(4, 2, 8, 4), kT0 + absl::Seconds(13));
  EXPECT_OK(w.Check(kT0 + absl::Seconds(13)));
}

// With short steps, groups short of a step are taken within partial_after:
// a queue of 3 (steps of 4) that has not moved for the stall plus that is
// stuck.
TEST(ProgressWatchTest, WithShortStepsGroupsShortOfAStepMustMoveWithinPartialAfter) {
  ProgressWatch w(kStall, 4, kT0, absl::Seconds(30));
  for (int s = 0; s <= 41; ++s) w.CameRound(QueueStats(3, 0, 3, 0), kT0 + absl::Seconds(s));
  EXPECT_OK(w.Check(kT0 + absl::Seconds(40)));
  EXPECT_THAT(w.Check(kT0 + absl::Seconds(41)),
              StatusIs(absl::StatusCode::kUnavailable, "the queue has not moved for 41s"));
  w.CameRound(QueueStats(0, 0, 3, 3), kT0 + absl::Seconds(42));  // the short step took them
  EXPECT_OK(w.Check(kT0 + absl::Seconds(47)));
}

TEST(ProgressWatchTest, ZeroStallIsAlwaysReady) {
  ProgressWatch w(absl::ZeroDuration(), 4, kT0);
  EXPECT_OK(w.Check(kT0 + absl::Hours(1)));
}

}  // namespace
}  // namespace asympo::learner
