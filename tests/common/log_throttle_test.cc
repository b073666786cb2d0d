#include "common/log_throttle.h"

#include <gtest/gtest.h>

namespace asympo {
namespace {

TEST(LogThrottleTest, OneLinePerIntervalWithTheCountHeldBack) {
  LogThrottle throttle(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t held_back = -1;
  ASSERT_TRUE(throttle.Allow(&held_back, t0));
  EXPECT_EQ(held_back, 0);
  EXPECT_EQ(throttle.HeldBack(held_back), "");
  for (int i = 1; i <= 5; ++i) EXPECT_FALSE(throttle.Allow(&held_back, t0 + absl::Seconds(i)));
  ASSERT_TRUE(throttle.Allow(&held_back, t0 + absl::Seconds(10)));
  EXPECT_EQ(held_back, 5);
  EXPECT_EQ(throttle.HeldBack(held_back), " (5 more such lines held back in the last 10s or so)");
  EXPECT_FALSE(throttle.Allow(&held_back, t0 + absl::Seconds(19)));
  ASSERT_TRUE(throttle.Allow(&held_back, t0 + absl::Seconds(31)));
  EXPECT_EQ(held_back, 1);
}

}  // namespace
}  // namespace asympo
