#include "common/daemon/stop_signals.h"

#include <signal.h>

#include <atomic>

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace asympo::daemon {
namespace {

using ::asympo::testing::StatusIs;
using ::asympo::testing::WaitFor;

TEST(StopSignalsTest, TheFirstSignalCallsStopOnce) {
  auto signals = StopSignals::Install();
  ASSERT_OK(signals);
  std::atomic<int> calls{0};
  (*signals)->OnStop([&] { ++calls; });
  ASSERT_EQ(::raise(SIGTERM), 0);
  EXPECT_TRUE(WaitFor([&] { return calls.load() == 1; }));
  ASSERT_EQ(::raise(SIGINT), 0);  // handled (the process lives), not called again
  signals->reset();
  EXPECT_EQ(calls.load(), 1);
}

TEST(StopSignalsTest, ASignalBeforeOnStopIsNotLost) {
  auto signals = StopSignals::Install();
  ASSERT_OK(signals);
  ASSERT_EQ(::raise(SIGINT), 0);
  std::atomic<int> calls{0};
  (*signals)->OnStop([&] { ++calls; });
  EXPECT_TRUE(WaitFor([&] { return calls.load() == 1; }));
}

TEST(StopSignalsTest, DestructionEndsTheWatcherWithoutCallingStop) {
  auto signals = StopSignals::Install();
  ASSERT_OK(signals);
  std::atomic<int> calls{0};
  (*signals)->OnStop([&] { ++calls; });
  const absl::Time t0 = absl::Now();
  signals->reset();  // joins the watcher: no call can come after this
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_EQ(calls.load(), 0);
  // A new instance can be installed once the old one is gone.
  EXPECT_OK(StopSignals::Install());
}

TEST(StopSignalsTest, DestructionWaitsForAStopInProgress) {
  auto signals = StopSignals::Install();
  ASSERT_OK(signals);
  std::atomic<bool> started{false}, finished{false};
  (*signals)->OnStop([&] {
    started = true;
    absl::SleepFor(absl::Milliseconds(200));  // a slow Shutdown
    finished = true;
  });
  ASSERT_EQ(::raise(SIGTERM), 0);
  ASSERT_TRUE(WaitFor([&] { return started.load(); }));
  signals->reset();
  EXPECT_TRUE(finished.load()) << "the watcher was abandoned while it ran the stop callback";
}

TEST(StopSignalsTest, OnlyOneInstanceAtATime) {
  auto first = StopSignals::Install();
  ASSERT_OK(first);
  auto second = StopSignals::Install();
  ASSERT_THAT(second, StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace asympo::daemon
