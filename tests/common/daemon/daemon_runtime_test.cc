#include "common/daemon/daemon_runtime.h"

#include <signal.h>

#include <atomic>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/daemon/metric_builders.h"
#include "tests/testing/http.h"
#include "tests/testing/wait.h"

namespace asympo::daemon {
namespace {

using ::testing::HasSubstr;

TEST(DaemonRuntimeTest, ServesTheRegistryAndNamesTheFlagOnError) {
  auto runtime = DaemonRuntime::Install();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_EQ((*runtime)->metrics_port(), 0);
  ASSERT_TRUE((*runtime)->ServeMetrics("").ok());  // empty: no endpoint
  metrics::AddGauge((*runtime)->registry(), "asympo_test_gauge", "A test gauge.").Set(5);
  ASSERT_TRUE((*runtime)->ServeMetrics("127.0.0.1:0").ok());
  EXPECT_THAT(asympo::testing::HttpGet("127.0.0.1", (*runtime)->metrics_port(), "/metrics"),
              HasSubstr("asympo_test_gauge 5"));
  const absl::Status bad = (*runtime)->ServeMetrics(":9464");
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--metrics_address: "));
}

TEST(DaemonRuntimeTest, ASignalDuringTheRunCallsShutdownAndNothingCallsItAfter) {
  auto runtime = DaemonRuntime::Install();
  ASSERT_TRUE(runtime.ok());
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
