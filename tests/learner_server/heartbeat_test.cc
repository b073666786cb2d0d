#include "learner_server/heartbeat.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::ScopedTempDir;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(HeartbeatTest, FirstBeatWritesTheTimeAndCount) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat")));  // no beat yet: startup not done
  ASSERT_TRUE((*hb)->Beat(kT0).ok());
  EXPECT_EQ(Read(dir.Path("beat")), "1700000000 1\n");
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat.tmp")));
}

TEST(HeartbeatTest, BeatsAtMostOncePerInterval) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"), absl::Seconds(5));
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_TRUE((*hb)->Beat(kT0).ok());
  ASSERT_TRUE((*hb)->Beat(kT0 + absl::Seconds(4)).ok());
  EXPECT_EQ(Read(dir.Path("beat")), "1700000000 1\n");
  ASSERT_TRUE((*hb)->Beat(kT0 + absl::Seconds(5)).ok());
  EXPECT_EQ(Read(dir.Path("beat")), "1700000005 2\n");
  EXPECT_EQ((*hb)->written(), 2);
}

TEST(HeartbeatTest, RemovesTheFileOfAnEarlierRun) {
  ScopedTempDir dir("heartbeat");
  std::ofstream(dir.Path("beat")) << "1700000000 42\n";
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat")));
}

TEST(HeartbeatTest, RefusesAFolderThatDoesNotExistNamingIt) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("missing/beat"));
  ASSERT_FALSE(hb.ok());
  EXPECT_NE(hb.status().message().find(dir.Path("missing")), std::string::npos) << hb.status();
  EXPECT_FALSE(Heartbeat::Create("").ok());
  EXPECT_FALSE(Heartbeat::Create(dir.path() + "/").ok());
}

TEST(HeartbeatTest, AFailedWriteIsReturnedAndTheNextGoodOneRecovers) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes into a read-only folder";
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_EQ(chmod(dir.path().c_str(), 0500), 0);
  EXPECT_FALSE((*hb)->Beat(kT0).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat")));
  ASSERT_EQ(chmod(dir.path().c_str(), 0700), 0);
  ASSERT_TRUE((*hb)->Beat(kT0 + absl::Milliseconds(10)).ok());  // not held back by the failure
  EXPECT_EQ(Read(dir.Path("beat")), "1700000000 1\n");
}

TEST(HeartbeatTest, AFileInPlaceOfTheFolderFailsTheBeat) {
  ScopedTempDir dir("heartbeat");
  auto hb = Heartbeat::Create(dir.Path("beat"));
  ASSERT_TRUE(hb.ok()) << hb.status();
  std::filesystem::create_directory(dir.Path("beat"));  // rename onto a folder fails
  const absl::Status s = (*hb)->Beat(kT0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("beat"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir.Path("beat.tmp")));
}

}  // namespace
}  // namespace asympo::learner
