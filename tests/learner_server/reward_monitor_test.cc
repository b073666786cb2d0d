#include "learner_server/reward_monitor.h"
#include "tests/testing/status_matchers.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

// A step's groups: one group of `responses` responses per (source, reward).
std::vector<SourceReward> StepRewards(const std::vector<std::pair<std::string, double>>& groups,
                                      int64_t responses = 8) {
  std::vector<SourceReward> out;
  for (const auto& [source, reward] : groups) {
    out.push_back({source, reward * static_cast<double>(responses), responses});
  }
  return out;
}

// Three honest sources around `honest` (a little apart, as real ones are).
std::vector<std::pair<std::string, double>> Honest(double honest) {
  return {{"a", honest}, {"b", honest + 0.02}, {"c", honest - 0.02}};
}

// `steps` steps of the honest fleet, plus one group of `outlier` from source
// "x" when `with_outlier`; returns the fleet detector's output per step.
std::string Steps(RewardMonitor& m, CollapseDetector* pooled, int steps, double honest,
                  bool with_outlier = false, double outlier = 0) {
  std::string out;
  for (int i = 0; i < steps; ++i) {
    auto groups = Honest(honest);
    if (with_outlier) groups.push_back({"x", outlier});
    const std::vector<SourceReward> step = StepRewards(groups);
    m.Observe(step);
    if (pooled != nullptr) {  // the step's pooled mean, as the learner judged it before
      double sum = 0, n = 0;
      for (const SourceReward& g : step) sum += g.sum, n += static_cast<double>(g.responses);
      pooled->Observe(sum / n);
    }
    out += m.fleet().suspected() ? '1' : '0';
  }
  return out;
}

TEST(RewardMonitorTest, OneSourcesLegalMillionRewardsDoNotLatchTheFleetsDetector) {
  // Source x sends rewards of 1e6 (within --max_abs_reward) in a quarter of
  // the responses for 10 steps, then stops; the honest sources stay at 0.6.
  RewardMonitor m{RewardMonitorOptions()};
  CollapseDetector pooled{CollapseOptions()};
  EXPECT_EQ(Steps(m, &pooled, 30, 0.6), std::string(30, '0'));
  EXPECT_EQ(Steps(m, &pooled, 10, 0.6, true, 1e6), std::string(10, '0'));
  EXPECT_EQ(Steps(m, &pooled, 200, 0.6), std::string(200, '0'));
  EXPECT_NEAR(m.fleet().peak(), 0.6, 0.05);
  EXPECT_NEAR(m.fleet().ema(), 0.6, 0.05);
  // The pooled EMA, one detector over every source's responses, took the
  // outlier's rewards for the fleet's: its peak went to tens of thousands
  // and the honest reward then read as a collapse, and stayed one.
  EXPECT_GT(pooled.peak(), 1e4);
  EXPECT_TRUE(pooled.suspected());
  // x's own series show it.
  ASSERT_EQ(m.sources().count("x"), 1u);
  EXPECT_GT(m.sources().at("x").detector.peak(), 1e5);
  // x has been silent for 200 steps: it left the median.
  EXPECT_EQ(m.active_sources(), 3);
}

TEST(RewardMonitorTest, OneSourcesMinusAMillionDoesNotFireTheFleetsDetector) {
  RewardMonitor m{RewardMonitorOptions()};
  CollapseDetector pooled{CollapseOptions()};
  Steps(m, &pooled, 30, 0.6);
  EXPECT_EQ(Steps(m, &pooled, 50, 0.6, true, -1e6), std::string(50, '0'));
  EXPECT_TRUE(pooled.suspected());
  EXPECT_NEAR(m.fleet().ema(), 0.6, 0.05);
}

TEST(RewardMonitorTest, TheHonestFleetsCollapseIsFoundWhateverTheOutlierSends) {
  // The outlier keeps sending 1e6 while the three honest sources fall from
  // 0.6 to 0.1: the median falls with them.
  RewardMonitor m{RewardMonitorOptions()};
  Steps(m, nullptr, 40, 0.6, true, 1e6);
  const std::string g = Steps(m, nullptr, 40, 0.1, true, 1e6);
  EXPECT_NE(g.find('1'), std::string::npos) << g;
  EXPECT_EQ(g.back(), '1') << g;
  for (const char* s : {"a", "b", "c"}) EXPECT_TRUE(m.sources().at(s).detector.suspected()) << s;
  EXPECT_FALSE(m.sources().at("x").detector.suspected());
}

TEST(RewardMonitorTest, OneSourceAloneIsTheFleet) {
  // Without authentication every group is "anonymous": the fleet's EMA is
  // that source's, as the learner's one EMA was.
  RewardMonitor m{RewardMonitorOptions()};
  CollapseDetector plain{CollapseOptions()};
  for (int i = 0; i < 100; ++i) {
    const double r = i < 50 ? 0.8 : 0.2;
    m.Observe(StepRewards({{"anonymous", r}}));
    plain.Observe(r);
    ASSERT_DOUBLE_EQ(m.fleet().ema(), plain.ema()) << i;
    ASSERT_EQ(m.fleet().suspected(), plain.suspected()) << i;
  }
  EXPECT_TRUE(m.fleet().suspected());
}

TEST(RewardMonitorTest, SourcesBeyondTheBoundShareOneLabel) {
  RewardMonitorOptions o;
  o.max_sources = 4;
  RewardMonitor m(o);
  for (int i = 0; i < 50; ++i) {
    m.Observe(StepRewards({{"s" + std::to_string(i), 0.5}, {"", 0.5}}));
  }
  EXPECT_EQ(m.sources().size(), 5u);
  EXPECT_EQ(m.sources().count(RewardMonitor::kOtherSources), 1u);
  EXPECT_EQ(m.sources().count(RewardMonitor::kNoSource), 1u);
  EXPECT_EQ(m.sources().count("s0"), 1u);
  EXPECT_EQ(m.sources().count("s49"), 0u);
}

TEST(RewardMonitorTest, AResumedMonitorKeepsThePeakItCollapsedFrom) {
  RewardMonitor m{RewardMonitorOptions()};
  Steps(m, nullptr, 40, 0.9);
  Steps(m, nullptr, 40, 0.2);
  ASSERT_TRUE(m.fleet().suspected());
  RewardMonitor resumed{RewardMonitorOptions()};
  ASSERT_OK(resumed.Restore(m.ToJson()));
  EXPECT_EQ(resumed.ToJson(), m.ToJson());
  EXPECT_EQ(Steps(resumed, nullptr, 40, 0.2), std::string(40, '1'));
  EXPECT_NEAR(resumed.fleet().peak(), 0.9, 0.02);
  // Started afresh, as before checkpoints kept it, the collapsed reward is
  // the new peak and nothing is suspected.
  RewardMonitor fresh{RewardMonitorOptions()};
  EXPECT_EQ(Steps(fresh, nullptr, 40, 0.2), std::string(40, '0'));
  // And it clears when the reward comes back.
  EXPECT_EQ(Steps(resumed, nullptr, 40, 0.9).back(), '0');
}

TEST(RewardMonitorTest, ARestoredStateIsCheckedFieldByField) {
  RewardMonitor m{RewardMonitorOptions()};
  Steps(m, nullptr, 3, 0.5);
  const std::string good = m.ToJson();
  auto refused = [](const std::string& text, const std::string& what) {
    RewardMonitor r{RewardMonitorOptions()};
    EXPECT_THAT(r.Restore(text), StatusIs(absl::StatusCode::kInvalidArgument, what)) << text;
    EXPECT_EQ(r.fleet().state().steps, 0) << "unchanged";
  };
  refused("[1]", "not a JSON object");
  refused(R"({"fleet": {}, "sources": []})", "the state.step");
  refused(R"({"step": 1, "sources": []})", "fleet is missing");
  refused(R"({"step": 1, "fleet": {"steps": 1, "below": 0, "ema": "x", "peak": 1,
             "suspected": false}, "sources": []})",
          "fleet.ema");
  refused(R"({"step": 1, "fleet": {"steps": 1, "below": 0, "ema": 1, "peak": 1,
             "suspected": false}, "sources": [{"steps": 1, "below": 0, "ema": 1, "peak": 1,
             "suspected": false, "source": "", "last_step": 1}]})",
          "sources[0].source");
  refused(R"({"step": 1, "fleet": {"steps": 1, "below": 0, "ema": 1, "peak": 1,
             "suspected": false}, "sources": [{"steps": 1, "below": 0, "ema": 1, "peak": 1,
             "suspected": false, "source": "a", "last_step": 7}]})",
          "sources[0].last_step is after step 1");
  RewardMonitorOptions one;
  one.max_sources = 1;
  RewardMonitor small(one);
  EXPECT_THAT(small.Restore(good), StatusIs(absl::StatusCode::kInvalidArgument, "holds 3 sources"));
}

TEST(RewardMonitorTest, BadOptionsAreNamed) {
  RewardMonitorOptions o;
  o.max_sources = 0;
  EXPECT_THAT(ValidateRewardMonitorOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_sources"));
  o = RewardMonitorOptions();
  o.source_idle_steps = 0;
  EXPECT_THAT(ValidateRewardMonitorOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "source_idle_steps"));
  EXPECT_OK(ValidateRewardMonitorOptions(RewardMonitorOptions()));
}

}  // namespace
}  // namespace asympo::learner
