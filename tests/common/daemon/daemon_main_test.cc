// The daemons' shared start-up (common/daemon/daemon_main.h): the flags it
// defines for both, the checks before /metrics is served, the exit statuses
// and the list flags' parser. Start runs once per process (it starts glog).
#include "common/daemon/daemon_main.h"

#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "common/daemon/metric_builders.h"
#include "tests/testing/status_matchers.h"

namespace asympo::daemon {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// What Run drives: Run() until done, Shutdown() on a signal.
struct FakeDaemon {
  absl::StatusOr<int64_t> Run() { return result; }
  void Shutdown() {}
  absl::StatusOr<int64_t> result = 3;
};

TEST(DaemonMainTest, StartsServesMetricsForTheRunAndGivesTheExitStatus) {
  char arg0[] = "asympo-test";
  char arg1[] = "--run_name=test-run";
  char arg2[] = "--threads=3";
  char* argv[] = {arg0, arg1, arg2};
  DaemonMain m("asympo-test", "asympo-test: a test.", "tests/common/daemon/daemon_main_test.cc");
  ASSERT_OK(m.Start(3, argv));
  EXPECT_EQ(absl::GetFlag(FLAGS_threads), 3);
  EXPECT_EQ(absl::GetFlag(FLAGS_tiny_vocab_size), 64);  // the daemons' default

  // Checked, but not served (a data-parallel rank other than 0).
  ASSERT_OK(m.ServeMetrics("127.0.0.1:0", /*serve=*/false));
  ASSERT_OK(m.ServeMetrics("127.0.0.1:0"));
  metrics::AddGauge(m.registry(), "asympo_test_gauge", "A test gauge.").Set(5);

  // Beyond loopback only with --metrics_insecure; a bad --run_name is named.
  EXPECT_THAT(m.ServeMetrics("10.1.2.3:9464", /*serve=*/false),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--metrics_insecure"));
  absl::SetFlag(&FLAGS_metrics_insecure, true);
  EXPECT_OK(m.ServeMetrics("10.1.2.3:9464", /*serve=*/false));
  absl::SetFlag(&FLAGS_run_name, "a b");
  EXPECT_THAT(m.ServeMetrics("", /*serve=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument, "--run_name"));

  FakeDaemon ok;
  EXPECT_EQ(m.Run(ok), 0);
  FakeDaemon failing;
  failing.result = absl::InternalError("the step failed");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(m.Run(failing), 2);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("asympo-test: the step failed\n"));
}

TEST(DaemonMainTest, FailNamesTheProgramAndExitsTwo) {
  const DaemonMain m("asympo-test", "", "x");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(m.Fail(absl::InvalidArgumentError("--lr=2: expected 0 to 1")), 2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "asympo-test: --lr=2: expected 0 to 1\n");
}

TEST(ParseIntListFlagTest, ParsesIntegersAtLeastTheMinimumAndNamesTheFlag) {
  std::vector<int64_t> steps;
  ASSERT_OK(ParseIntListFlag({"1", "5"}, "fault_steps", &steps));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 5}));
  std::vector<uint64_t> versions;
  ASSERT_OK(ParseIntListFlag({"0"}, "versions", &versions, uint64_t{0}));
  EXPECT_EQ(versions, (std::vector<uint64_t>{0}));
  std::vector<int64_t> bad;
  EXPECT_THAT(
      ParseIntListFlag({"0"}, "fault_steps", &bad),
      StatusIs(absl::StatusCode::kInvalidArgument, "--fault_steps: \"0\" is not an integer >= 1"));
  EXPECT_THAT(ParseIntListFlag({"x"}, "fault_steps", &bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"x\""));
}

}  // namespace
}  // namespace asympo::daemon
