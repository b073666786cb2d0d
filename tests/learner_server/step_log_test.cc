#include "learner_server/step_log.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/log_lines.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::StartsWith;

constexpr char kHeader[] =
    "time_s,step,version,reward_mean,reward_std,loss,s_pos,s_neg,grad_norm,lr,tokens_per_s,"
    "queue_depth,staleness_mean,mean_response_length";

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

StepResult StepAt(uint64_t version) {
  StepResult s;
  s.version = version;
  s.diagnostics.reward_mean = 0.5;
  s.diagnostics.loss = 0.25;
  s.grad_norm = 2;
  s.learning_rate = 1e-3;
  s.tokens = 100;
  s.seconds = 0.5;
  s.staleness = {1, 3};
  return s;
}

GroupQueueStats QueueOfDepth(int64_t depth) {
  GroupQueueStats q;
  q.depth_groups = depth;
  q.capacity_groups = 8;
  return q;
}

TEST(StepLogTest, ANewCsvGetsTheHeaderThenARowPerStepAndAReopenedOneOnlyRows) {
  asympo::testing::ScopedTempDir tmp("step_log_test");
  const std::string path = tmp.Path("steps.csv");
  {
    ASSERT_OK_AND_ASSIGN(auto log, StepLog::Open(path, absl::Seconds(10)));
    log->Write(1, 1, StepAt(1), QueueOfDepth(3), false);
    log->Write(2, 2, StepAt(2), QueueOfDepth(4), false);
    // Flushed at once: a reader sees every row while the learner runs.
    ASSERT_EQ(Lines(path).size(), 3u);
  }
  {
    ASSERT_OK_AND_ASSIGN(auto log, StepLog::Open(path, absl::Seconds(10)));
    log->Write(1, 3, StepAt(3), QueueOfDepth(0), false);
  }
  const std::vector<std::string> lines = Lines(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], kHeader);
  EXPECT_THAT(std::vector<std::string>(lines.begin() + 1, lines.end()),
              ElementsAre(::testing::HasSubstr(",1,1,0.5,0,0.25,0,0,2,0.001,200.0,3,2.000,0.000"),
                          ::testing::HasSubstr(",2,2,0.5,"), ::testing::HasSubstr(",3,3,0.5,")));
}

TEST(StepLogTest, WithoutAPathThereIsNoCsvAndAnUnwritableOneIsNamed) {
  EXPECT_OK(StepLog::Open("", absl::Seconds(10)));
  asympo::testing::ScopedTempDir tmp("step_log_test");
  const std::string path = tmp.Path("missing/steps.csv");
  EXPECT_THAT(StepLog::Open(path, absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot open step_csv_path " + path));
}

TEST(StepLogTest, TheLogLineIsThrottledAfterTenStepsButACollapseThatBeginsIsLogged) {
  asympo::testing::LineCounter lines("step ");
  asympo::testing::LineCounter collapses("COLLAPSE SUSPECTED");
  ASSERT_OK_AND_ASSIGN(auto log, StepLog::Open("", absl::Hours(1)));
  for (int64_t i = 1; i <= 20; ++i) log->Write(i, i, StepAt(i), QueueOfDepth(0), false);
  EXPECT_EQ(lines.count(), 10) << "every step of the first 10, then one an hour";
  log->Write(21, 21, StepAt(21), QueueOfDepth(0), true);
  log->Write(22, 22, StepAt(22), QueueOfDepth(0), true);
  EXPECT_EQ(collapses.count(), 1) << "the suspicion that begins, once";
}

}  // namespace
}  // namespace asympo::learner
