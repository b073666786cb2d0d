// The policy lag: a group's policy version, the checks at admission, the
// drops before a step and what is observed and reported.
#include "learner_server/admission/policy_lag.h"

#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "learner_server/learner_metrics.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::RolloutBatchBuilder;
using ::asympo::testing::StatusIs;

// Sets response r's versions (nullopt: left unset).
void SetVersions(v1::Response* r, std::optional<uint64_t> first, std::optional<uint64_t> last) {
  if (first.has_value()) r->set_first_policy_version(*first);
  if (last.has_value()) r->set_last_policy_version(*last);
}

// Groups "p<g>" of 3 responses, every response of group g sampled from
// `first[g]` to `first[g] + 1` (nullopt: no versions).
v1::RolloutBatch LagBatch(const std::vector<std::optional<uint64_t>>& first) {
  v1::RolloutBatch b = RolloutBatchBuilder(static_cast<int>(first.size()), 3).Build();
  for (size_t g = 0; g < first.size(); ++g) {
    if (!first[g].has_value()) continue;
    for (v1::Response& r : *b.mutable_groups(static_cast<int>(g))->mutable_responses()) {
      SetVersions(&r, first[g], *first[g] + 1);
    }
  }
  return b;
}

// The batch's groups as queued by `source`.
std::vector<QueuedGroup> Queued(const v1::RolloutBatch& b, const std::string& source) {
  std::vector<QueuedGroup> out;
  for (const v1::PromptGroup& g : b.groups()) {
    QueuedGroup q;
    q.group = g;
    q.source = source;
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<std::string> GroupIds(const std::vector<QueuedGroup>& groups) {
  std::vector<std::string> out;
  for (const QueuedGroup& g : groups) out.push_back(g.group.prompt_id());
  return out;
}

TEST(PolicyLagTest, AGroupsVersionIsTheOldestFirstVersionOfItsResponses) {
  v1::RolloutBatch b = LagBatch({std::nullopt});
  v1::PromptGroup& g = *b.mutable_groups(0);
  EXPECT_EQ(GroupPolicyVersion(g), std::nullopt);
  SetVersions(g.mutable_responses(0), 9, 12);
  SetVersions(g.mutable_responses(2), 7, 7);
  EXPECT_EQ(GroupPolicyVersion(g), 7u);  // response 1 carries none: not counted
  EXPECT_EQ(LagAt(7, 10), 3u);
  EXPECT_EQ(LagAt(7, 5), 0u);
}

// A version above the learner's comes from another incarnation (a restart
// from an older checkpoint) or run: stale, refused as the lag bound refuses
// (FAILED_PRECONDITION, counted as policy lag), never as an invalid batch.
TEST(PolicyLagTest, AVersionAboveTheLearnersIsStaleNamingTheResponseAndBothVersions) {
  v1::RolloutBatch b = LagBatch({4, std::nullopt});
  SetVersions(b.mutable_groups(1)->mutable_responses(2), 6, std::nullopt);
  EXPECT_OK(CheckPolicyVersions(LagBatch({4}), 5, 0));  // last 5 = the learner's: fine
  const AdmissionResult future = CheckPolicyVersions(b, 5, 0);
  EXPECT_TRUE(future.outcome() == AdmissionOutcome::kPolicyLag) << future;
  EXPECT_THAT(future,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "group 1 (prompt_id \"p1\") response 2: first_policy_version 6 is newer "
                       "than the learner's version 5"));
  EXPECT_THAT(CheckPolicyVersions(LagBatch({4}), 4, 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "group 0 (prompt_id \"p0\") response 0: first_policy_version 4 (last 5) is "
                       "newer than the learner's version 4"));
}

TEST(PolicyLagTest, AGroupBeyondTheBoundIsRefusedWithFailedPrecondition) {
  // Version 10, bound 4: a group of version 6 is 4 behind (in), 5 is out;
  // a group without versions is not bounded.
  EXPECT_OK(CheckPolicyVersions(LagBatch({6, std::nullopt, 9}), 10, 4));
  EXPECT_OK(CheckPolicyVersions(LagBatch({0}), 10, 0));  // no bound
  const AdmissionResult s = CheckPolicyVersions(LagBatch({6, 5}), 10, 4);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          "group 1 (prompt_id \"p1\"): sampled by policy version 5 (its oldest "
                          "first_policy_version), 5 versions behind the learner's version 10, "
                          "more than its --max_policy_lag 4"));
  EXPECT_EQ(s.outcome(), AdmissionOutcome::kPolicyLag);
  EXPECT_EQ(CheckPolicyVersions(LagBatch({11}), 10, 4).outcome(), AdmissionOutcome::kPolicyLag);
  // A response from the future is named first, whichever group it is in.
  EXPECT_THAT(CheckPolicyVersions(LagBatch({0, 11}), 10, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition, "group 1"));
}

class PolicyLagCountsTest : public ::testing::Test {
 protected:
  double Dropped() const { return metrics_.dropped.Value(); }
  uint64_t Observed() const { return metrics_.lag.Collect().histogram.sample_count; }
  double LagSum() const { return metrics_.lag.Collect().histogram.sample_sum; }

  prometheus::Registry registry_;
  PolicyLagMetrics metrics_ = RegisterPolicyLagMetrics(registry_);
};

// Bound 2 at version 10: versions 7 and 5 are behind it, 8 and unversioned
// groups are not; the queue keeps those in order, and a step's popped
// groups are checked the same way.
TEST_F(PolicyLagCountsTest, DropsExactlyTheGroupsBehindTheBoundAndCountsThemBySource) {
  PolicyLag lag(2, metrics_);
  GroupQueue queue({8, 4});
  ASSERT_OK(queue.Push(Queued(LagBatch({7, 8, std::nullopt, 5}), "gen-a"), absl::InfiniteFuture()));
  EXPECT_EQ(lag.DropBehind(queue, 10), 2);
  EXPECT_EQ(GroupIds(queue.Pop(2, absl::InfiniteFuture())), (std::vector<std::string>{"p1", "p2"}));
  std::vector<QueuedGroup> popped = Queued(LagBatch({8, 7}), "gen-b");
  EXPECT_EQ(lag.DropPopped(&popped, 10), 1);
  EXPECT_EQ(GroupIds(popped), (std::vector<std::string>{"p0"}));
  lag.CountRefused("gen-b");
  EXPECT_EQ(Dropped(), 3.0);

  v1::LearnerStatus status;
  lag.Fill(&status);
  EXPECT_EQ(status.max_policy_lag(), 2u);
  EXPECT_EQ(status.dropped_lag_groups(), 3u);
  EXPECT_EQ(status.rejected_lag_batches(), 1u);
  ASSERT_EQ(status.source_policy_lags_size(), 2);
  EXPECT_EQ(status.source_policy_lags(0).source(), "gen-a");
  EXPECT_EQ(status.source_policy_lags(0).dropped_groups(), 2u);
  EXPECT_EQ(status.source_policy_lags(1).dropped_groups(), 1u);
  EXPECT_EQ(status.source_policy_lags(1).rejected_batches(), 1u);
}

TEST_F(PolicyLagCountsTest, WithoutABoundNothingIsDropped) {
  PolicyLag lag(0, metrics_);
  GroupQueue queue({8, 4});
  ASSERT_OK(queue.Push(Queued(LagBatch({0, 1}), "gen"), absl::InfiniteFuture()));
  EXPECT_EQ(lag.DropBehind(queue, 100), 0);
  std::vector<QueuedGroup> popped = queue.Pop(2, absl::InfiniteFuture());
  EXPECT_EQ(lag.DropPopped(&popped, 100), 0);
  EXPECT_EQ(popped.size(), 2u);
  EXPECT_EQ(Dropped(), 0.0);
}

// Trained groups are observed, except those without versions and those
// the step dropped as poisoned; per source: last, mean and largest lag.
TEST_F(PolicyLagCountsTest, ObservesTheLagOfTrainedGroupsThatCarryAVersion) {
  PolicyLag lag(0, metrics_);
  std::vector<QueuedGroup> groups = Queued(LagBatch({9, std::nullopt, 4, 7}), "gen");
  groups[3].source = "other";
  const std::vector<GroupLag> lags = LagsOf(groups, 10);
  ASSERT_EQ(lags.size(), 4u);
  EXPECT_EQ(lags[1].lag, std::nullopt);
  lag.ObserveTrained(lags, /*dropped=*/{3});
  EXPECT_EQ(Observed(), 2u);
  EXPECT_EQ(LagSum(), 7.0);
  v1::LearnerStatus status;
  lag.Fill(&status);
  ASSERT_EQ(status.source_policy_lags_size(), 1);  // "other"'s only group was dropped
  const v1::SourcePolicyLag& s = status.source_policy_lags(0);
  EXPECT_EQ(s.source(), "gen");
  EXPECT_EQ(s.trained_groups(), 2u);
  EXPECT_EQ(s.last_lag(), 6u);
  EXPECT_DOUBLE_EQ(s.mean_lag(), 3.5);
  EXPECT_EQ(s.max_lag(), 6u);
  EXPECT_EQ(status.max_policy_lag(), 0u);
}

}  // namespace
}  // namespace asympo::learner
