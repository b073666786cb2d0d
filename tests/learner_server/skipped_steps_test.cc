#include "learner_server/skipped_steps.h"

#include <gtest/gtest.h>

#include "learner_server/learner_metrics.h"
#include "learner_server/trainer.h"
#include "tests/testing/metrics.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::MetricValue;

absl::Status WithReason(const char* reason) {
  absl::Status s = absl::InternalError(std::string("failed: ") + reason);
  s.SetPayload("type.asympo/learner.skip_reason", absl::Cord(reason));
  return s;
}

TEST(SkippedStepsTest, EveryReasonIsExportedFromTheStartAtZero) {
  prometheus::Registry registry;
  SkippedSteps skipped(RegisterSkippedStepCounters(registry));
  for (const char* reason : {kSkipNonFiniteLoss, kSkipNonFiniteGradient, kSkipInvalidBatch,
                             kSkipOutOfMemory, kSkipTorchError}) {
    EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", reason), 0) << reason;
  }
  EXPECT_EQ(MetricValue(registry, "asympo_learner_skipped_groups_total"), 0);
}

TEST(SkippedStepsTest, CountsByReasonAndLogsOncePerReasonAndInterval) {
  prometheus::Registry registry;
  SkippedSteps skipped(RegisterSkippedStepCounters(registry), absl::Hours(1));
  for (int i = 0; i < 5; ++i) skipped.Record(WithReason(kSkipNonFiniteLoss), 8);
  skipped.Record(WithReason(kSkipTorchError), 8);
  skipped.Record(absl::InternalError("no reason attached"), 2);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", kSkipNonFiniteLoss), 5);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", kSkipTorchError), 1);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_steps_skipped_total", "error"), 1);
  EXPECT_EQ(MetricValue(registry, "asympo_learner_skipped_groups_total"), 5 * 8 + 8 + 2);
  EXPECT_EQ(skipped.total(), 7);
  EXPECT_EQ(skipped.count(kSkipNonFiniteLoss), 5);
  // Five failures of one reason within the interval: one log line.
  EXPECT_EQ(skipped.logged(kSkipNonFiniteLoss), 1);
  EXPECT_EQ(skipped.logged(kSkipTorchError), 1);
}

TEST(SkippedStepsTest, LogsAgainOnceTheIntervalHasPassed) {
  prometheus::Registry registry;
  SkippedSteps skipped(RegisterSkippedStepCounters(registry), absl::ZeroDuration());
  for (int i = 0; i < 3; ++i) skipped.Record(WithReason(kSkipOutOfMemory), 1);
  EXPECT_EQ(skipped.logged(kSkipOutOfMemory), 3);
}

}  // namespace
}  // namespace asympo::learner
