#include "common/daemon/daemon_runtime.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/daemon/metric_builders.h"
#include "tests/testing/http.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace asympo::daemon {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DaemonRuntimeTest, ServesTheRegistryAndNamesTheFlagOnError) {
  auto runtime = DaemonRuntime::Install();
  ASSERT_OK(runtime);
  EXPECT_EQ((*runtime)->metrics_port(), 0);
  ASSERT_OK((*runtime)->ServeMetrics(""));  // empty: no endpoint
  metrics::AddGauge((*runtime)->registry(), "asympo_test_gauge", "A test gauge.").Set(5);
  ASSERT_OK((*runtime)->ServeMetrics("127.0.0.1:0"));
  EXPECT_THAT(asympo::testing::HttpGet("127.0.0.1", (*runtime)->metrics_port(), "/metrics"),
              HasSubstr("asympo_test_gauge 5"));
  const absl::Status bad = (*runtime)->ServeMetrics(":9464");
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--metrics_address: "));
}

TEST(DaemonRuntimeTest, LabelsEverySeriesWithTheRunName) {
  auto runtime = DaemonRuntime::Install();
  ASSERT_OK(runtime);
  metrics::AddGauge((*runtime)->registry(), "asympo_test_gauge", "A test gauge.").Set(5);
  ASSERT_OK((*runtime)->ServeMetrics("127.0.0.1:0", "slurm-4711"));
  EXPECT_THAT(asympo::testing::HttpGet("127.0.0.1", (*runtime)->metrics_port(), "/metrics"),
              HasSubstr("asympo_test_gauge{run=\"slurm-4711\"} 5"));
}

// A peer that goes away mid-write (a data-parallel rank killed while rank
// 0 sends it a step over Gloo's sockets, which write without
// MSG_NOSIGNAL) must come back as EPIPE on that write, never as a SIGPIPE
// that kills the daemon before it can report the lost peer.
TEST(DaemonRuntimeDeathTest, AWriteToAClosedSocketIsAnErrorNotASignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts threads
  EXPECT_EXIT(
      {
        auto runtime = DaemonRuntime::Install();
        if (!runtime.ok()) std::_Exit(2);
        int fds[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::_Exit(3);
        ::close(fds[1]);
        const char byte = 'x';
        const ssize_t n = ::write(fds[0], &byte, 1);
        std::_Exit(n == -1 && errno == EPIPE ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(RunNameTest, KeepsAGoodNameAndNamesTheFlagForABadOne) {
  for (const char* good : {"slurm-4711", "exp_3.lr1e-5", "team/a:b@c+d", "x"}) {
    absl::StatusOr<std::string> name = RunName(good);
    ASSERT_OK(name) << good << ": " << name.status();
    EXPECT_EQ(*name, good);
  }
  for (const std::string bad :
       {std::string("a b"), std::string("quote\""), std::string("new\nline"), std::string(129, 'x'),
        std::string("caf\xc3\xa9")}) {
    const absl::Status s = RunName(bad).status();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "--run_name")) << bad;
  }
}

TEST(RunNameTest, WithoutANameMakesOneFromTheHostAndTheStartTime) {
  absl::StatusOr<std::string> a = RunName("");
  ASSERT_OK(a);
  EXPECT_THAT(*a, ::testing::MatchesRegex("[A-Za-z0-9._-]+-[0-9]{8}T[0-9]{6}Z-[0-9]+"));
  EXPECT_OK(RunName(*a));  // a made name is a valid name
}

TEST(DaemonRuntimeTest, ASignalDuringTheRunCallsShutdownAndNothingCallsItAfter) {
  auto runtime = DaemonRuntime::Install();
  ASSERT_OK(runtime);
  std::atomic<int> shutdowns{0};
  const int result = (*runtime)->RunUntilStopped<int>(
      [&] { ++shutdowns; },
      [&] {
        ::raise(SIGTERM);
        // A daemon's Run returns once Shutdown was called.
        return asympo::testing::WaitFor([&] { return shutdowns.load() == 1; }) ? 7 : -1;
      });
  EXPECT_EQ(result, 7);
  EXPECT_EQ(shutdowns.load(), 1);
}

}  // namespace
}  // namespace asympo::daemon
