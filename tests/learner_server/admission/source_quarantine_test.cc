#include "learner_server/admission/source_quarantine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/time/time.h"
#include "learner_server/learner_metrics.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

double Value(prometheus::Registry& registry, const std::string& name,
             const std::string& source = "") {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      const bool match = source.empty() || (!m.label.empty() && m.label[0].value == source);
      if (!match) continue;
      return family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return -1;
}

TEST(SourceQuarantineTest, ASourceIsRefusedForAWhileAfterEnoughPoisonWithinTheWindow) {
  prometheus::Registry registry;
  QuarantineOptions o;
  o.max_poisoned_groups = 3;
  o.window = absl::Minutes(1);
  o.duration = absl::Minutes(5);
  SourceQuarantine q(o, RegisterQuarantineCounters(registry));
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  absl::Duration retry;
  EXPECT_FALSE(q.RecordPoisoned("gen-a", 2, t0));
  EXPECT_OK(q.Admit("gen-a", t0, &retry)) << "2 of 3: still admitted";
  EXPECT_TRUE(q.RecordPoisoned("gen-a", 1, t0 + absl::Seconds(30)));
  const absl::Status s = q.Admit("gen-a", t0 + absl::Seconds(40), &retry);
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kResourceExhausted, "source \"gen-a\" is refused until"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("3 of its groups made training steps non-finite"));
  EXPECT_EQ(retry, absl::Minutes(5) - absl::Seconds(10));
  EXPECT_OK(q.Admit("gen-b", t0 + absl::Seconds(40), &retry)) << "others are not refused";
  EXPECT_EQ(Value(registry, "asympo_learner_quarantined_sources"), 1);
  EXPECT_EQ(Value(registry, "asympo_learner_poisoned_groups_total", "gen-a"), 3);
  EXPECT_EQ(Value(registry, "asympo_learner_quarantines_total", "gen-a"), 1);
  // Over when the duration has passed.
  EXPECT_OK(q.Admit("gen-a", t0 + absl::Seconds(30) + absl::Minutes(5), &retry));
  EXPECT_EQ(Value(registry, "asympo_learner_quarantined_sources"), 0);
}

TEST(SourceQuarantineTest, PoisonOlderThanTheWindowIsForgotten) {
  prometheus::Registry registry;
  QuarantineOptions o;
  o.max_poisoned_groups = 2;
  o.window = absl::Minutes(1);
  SourceQuarantine q(o, RegisterQuarantineCounters(registry));
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  EXPECT_FALSE(q.RecordPoisoned("gen-a", 1, t0));
  EXPECT_FALSE(q.RecordPoisoned("gen-a", 1, t0 + absl::Minutes(2)));
  absl::Duration retry;
  EXPECT_OK(q.Admit("gen-a", t0 + absl::Minutes(2), &retry));
}

TEST(SourceQuarantineTest, ZeroNeverQuarantinesButStillCounts) {
  prometheus::Registry registry;
  QuarantineOptions o;
  o.max_poisoned_groups = 0;
  SourceQuarantine q(o, RegisterQuarantineCounters(registry));
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  EXPECT_FALSE(q.RecordPoisoned("gen-a", 100, t0));
  absl::Duration retry;
  EXPECT_OK(q.Admit("gen-a", t0, &retry));
  EXPECT_EQ(Value(registry, "asympo_learner_poisoned_groups_total", "gen-a"), 100);
}

TEST(SourceQuarantineTest, OptionsAreCheckedByFlag) {
  QuarantineOptions o;
  EXPECT_OK(ValidateQuarantineOptions(o));
  o.max_poisoned_groups = -1;
  EXPECT_THAT(ValidateQuarantineOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "--quarantine_after_groups=-1"));
  o = QuarantineOptions();
  o.duration = absl::ZeroDuration();
  EXPECT_THAT(
      ValidateQuarantineOptions(o),
      StatusIs(absl::StatusCode::kInvalidArgument, "--quarantine_duration=0: expected 1s to 168h"));
}

}  // namespace
}  // namespace asympo::learner
