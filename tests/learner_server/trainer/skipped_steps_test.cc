#include "learner_server/trainer/skipped_steps.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "learner_server/learner_metrics.h"
#include "tests/testing/metrics.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::MetricValue;

StepFailure Failure(SkipReason reason) {
  return {absl::InternalError(absl::StrCat("failed: ", SkipReasonLabel(reason))), reason};
}

TEST(SkippedStepsTest, EveryReasonIsExportedFromTheStartAtZero) {
  prometheus::Registry registry;
  SkippedSteps skipped(RegisterSkippedStepCounters(registry));
  for (const char* reason : {"nonfinite_loss", "nonfinite_gradient", "invalid_batch",
                             "out_of_memory", "torch_error", "poisoned_groups"}) {
    EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", reason), 0) << reason;
  }
  EXPECT_EQ(MetricValue(registry, "asympo_learner_skipped_groups_total"), 0);
}

TEST(SkippedStepsTest, CountsByReasonAndLogsOncePerReasonAndInterval) {
  prometheus::Registry registry;
  SkippedSteps skipped(RegisterSkippedStepCounters(registry), absl::Hours(1));
  for (int i = 0; i < 5; ++i) skipped.Record(Failure(SkipReason::kNonFiniteLoss), 8);
  skipped.Record(Failure(SkipReason::kTorchError), 8);
  skipped.Record(Failure(SkipReason::kPoisonedGroups), 2);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", "nonfinite_loss"), 5);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", "torch_error"), 1);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", "poisoned_groups"), 1);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_skipped_groups_total"), 5 * 8 + 8 + 2);
  EXPECT_EQ(skipped.total(), 7);
  EXPECT_EQ(skipped.count(SkipReason::kNonFiniteLoss), 5);
  // Five failures of one reason within the interval: one log line.
  EXPECT_EQ(skipped.logged(SkipReason::kNonFiniteLoss), 1);
  EXPECT_EQ(skipped.logged(SkipReason::kTorchError), 1);
}

TEST(SkippedStepsTest, LogsAgainOnceTheIntervalHasPassed) {
  prometheus::Registry registry;
  SkippedSteps skipped(RegisterSkippedStepCounters(registry), absl::ZeroDuration());
  for (int i = 0; i < 3; ++i) skipped.Record(Failure(SkipReason::kOutOfMemory), 1);
  EXPECT_EQ(skipped.logged(SkipReason::kOutOfMemory), 3);
}

}  // namespace
}  // namespace asympo::learner
