#include "learner_server/heartbeat.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::ReadFile;
using ::asympo::testing::ScopedTempDir;
using ::asympo::testing::StatusIs;

const absl::Time kBeatT0 = absl::FromUnixSeconds(1700000000);

TEST(HeartbeatTest, FirstBeatWritesTheTimeAndCount) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_OK(hb);
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat")));  // no beat yet: startup not done
  ASSERT_OK((*hb)->Beat(kBeatT0));
  EXPECT_EQ(ReadFile(dir.Path("beat")), "1700000000 1\n");
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat.tmp")));
}

TEST(HeartbeatTest, BeatsAtMostOncePerInterval) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"), absl::Seconds(5));
  ASSERT_OK(hb);
  ASSERT_OK((*hb)->Beat(kBeatT0));
  ASSERT_OK((*hb)->Beat(kBeatT0 + absl::Seconds(4)));
  EXPECT_EQ(ReadFile(dir.Path("beat")), "1700000000 1\n");
  ASSERT_OK((*hb)->Beat(kBeatT0 + absl::Seconds(5)));
  EXPECT_EQ(ReadFile(dir.Path("beat")), "1700000005 2\n");
  EXPECT_EQ((*hb)->written(), 2);
}

TEST(HeartbeatTest, RemovesTheFileOfAnEarlierRun) {
  ScopedTempDir dir("heartbeat");
  std::ofstream(dir.Path("beat")) << "1700000000 42\n";
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_OK(hb);
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat")));
}

TEST(HeartbeatTest, RefusesAFolderThatDoesNotExistNamingIt) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("missing/beat"));
  EXPECT_THAT(hb, StatusIs(absl::StatusCode::kInvalidArgument, dir.Path("missing")));
  EXPECT_THAT(Heartbeat::Create(""), StatusIs(absl::StatusCode::kInvalidArgument, "file name"));
  EXPECT_THAT(Heartbeat::Create(dir.path() + "/"),
              StatusIs(absl::StatusCode::kInvalidArgument, "file name"));
}

TEST(HeartbeatTest, AFailedWriteIsReturnedAndTheNextGoodOneRecovers) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes into a read-only folder";
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_OK(hb);
  ASSERT_EQ(chmod(dir.path().c_str(), 0500), 0);
  EXPECT_THAT((*hb)->Beat(kBeatT0), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat")));
  ASSERT_EQ(chmod(dir.path().c_str(), 0700), 0);
  ASSERT_OK((*hb)->Beat(kBeatT0 + absl::Milliseconds(10)));  // not held back by the failure
  EXPECT_EQ(ReadFile(dir.Path("beat")), "1700000000 1\n");
}

TEST(HeartbeatTest, AFileInPlaceOfTheFolderFailsTheBeat) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_OK(hb);
  std::filesystem::create_directory(dir.Path("beat"));  // rename onto a folder fails
  const absl::Status s = (*hb)->Beat(kBeatT0);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "beat"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat.tmp")));
}

}  // namespace
}  // namespace asympo::learner
