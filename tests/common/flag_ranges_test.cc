#include "common/flag_ranges.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "tests/testing/status_matchers.h"

ABSL_FLAG(double, test_rate, 0.5, "A ranged double.");
ASYMPO_FLAG_RANGE(test_rate, 0, 1);
ABSL_FLAG(int64_t, test_count, 3, "A ranged integer.");
ASYMPO_FLAG_RANGE(test_count, 1, 1 << 20);
ABSL_FLAG(absl::Duration, test_wait, absl::Seconds(1), "A ranged duration.");
ASYMPO_DURATION_FLAG_RANGE(test_wait, absl::Milliseconds(1), absl::Minutes(10));
ABSL_FLAG(bool, test_switch, false, "Not numeric: needs no range.");

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kThisFile[] = "tests/common/flag_ranges_test.cc";

class FlagRangesTest : public ::testing::Test {
 protected:
  void TearDown() override {
    absl::SetFlag(&FLAGS_test_rate, 0.5);
    absl::SetFlag(&FLAGS_test_count, 3);
    absl::SetFlag(&FLAGS_test_wait, absl::Seconds(1));
  }
};

TEST_F(FlagRangesTest, TheDefaultsAreWithinTheirRanges) { EXPECT_OK(CheckFlagRanges(kThisFile)); }

TEST_F(FlagRangesTest, AValueOutsideItsRangeIsNamedWithTheRange) {
  absl::SetFlag(&FLAGS_test_rate, 1e9);
  absl::Status s = CheckFlagRanges(kThisFile);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(s.message(), "--test_rate=1000000000: expected 0 to 1");
  absl::SetFlag(&FLAGS_test_rate, 0.5);
  absl::SetFlag(&FLAGS_test_count, -1);
  EXPECT_EQ(CheckFlagRanges(kThisFile).message(), "--test_count=-1: expected 1 to 1048576");
  absl::SetFlag(&FLAGS_test_count, 3);
  absl::SetFlag(&FLAGS_test_wait, absl::Hours(2));
  EXPECT_EQ(CheckFlagRanges(kThisFile).message(), "--test_wait=2h: expected 1ms to 10m");
  absl::SetFlag(&FLAGS_test_wait, absl::ZeroDuration());
  EXPECT_THAT(CheckFlagRanges(kThisFile).message(), HasSubstr("--test_wait=0: expected 1ms"));
}

TEST_F(FlagRangesTest, NotANumberIsOutsideEveryRange) {
  absl::SetFlag(&FLAGS_test_rate, std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(CheckFlagRanges(kThisFile).message(), HasSubstr("--test_rate=nan: expected 0 to 1"));
}

TEST_F(FlagRangesTest, TheBoundsAreInclusive) {
  absl::SetFlag(&FLAGS_test_rate, 1.0);
  absl::SetFlag(&FLAGS_test_count, 1 << 20);
  absl::SetFlag(&FLAGS_test_wait, absl::Milliseconds(1));
  EXPECT_OK(CheckFlagRanges(kThisFile));
}

TEST_F(FlagRangesTest, TheRangeTextIsWhatHelpShows) {
  EXPECT_EQ(FlagRangeText("test_rate"), "0 to 1");
  EXPECT_EQ(FlagRangeText("test_wait"), "1ms to 10m");
  EXPECT_EQ(FlagRangeText("test_switch"), "");
}

TEST_F(FlagRangesTest, ANumericFlagWithoutARangeIsABuildDefect) {
  // flag_ranges_unranged.cc defines one.
  const absl::Status s = CheckFlagRanges("tests/common/flag_ranges_unranged.cc");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal, "--test_unranged has no documented range"));
}

}  // namespace
}  // namespace asympo
