// Checkpoint saves that fail part way: nothing of them is left behind.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "learner_server/trainer/checkpoint.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// Every descriptor this process may open is taken while it lives (the soft
// RLIMIT_NOFILE lowered to just above the highest one open, the holes below
// it filled); the limit and the descriptors are given back at the end.
class OutOfDescriptors {
 public:
  OutOfDescriptors() {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    int highest = 2;
    if (DIR* dir = ::opendir("/proc/self/fd")) {
      while (const dirent* e = ::readdir(dir)) highest = std::max(highest, std::atoi(e->d_name));
      ::closedir(dir);
    }
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(highest + 1);
    ::setrlimit(RLIMIT_NOFILE, &lowered);
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held_.push_back(fd);
  }
  ~OutOfDescriptors() {
    for (const int fd : held_) ::close(fd);
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }

 private:
  rlimit saved_{};
  std::vector<int> held_;
};

std::vector<std::string> Unfinished(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    if (e.path().filename().string().rfind(".tmp-ckpt-", 0) == 0) out.push_back(e.path());
  }
  return out;
}

TEST(CheckpointFailureTest, ASaveOutOfDescriptorsLeavesNoTemporaryDirectoryAndNamesTheErrno) {
  asympo::testing::ScopedTempDir tmp("checkpoint_failure_test");
  auto model = ::asympo::testing::TinyPolicy(32, 1);
  AdamW optimizer(model->parameters(), {});
  absl::StatusOr<CheckpointInfo> saved;
  {
    OutOfDescriptors exhausted;
    saved = SaveCheckpoint(tmp.path(), 3, *model, optimizer, "--config");
  }
  ASSERT_THAT(saved, StatusIs(absl::StatusCode::kInternal, "Too many open files (errno 24)"));
  EXPECT_THAT(Unfinished(tmp.path()), ::testing::IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(tmp.Path("ckpt-000000000003")));

  // With descriptors again, the same save succeeds.
  saved = SaveCheckpoint(tmp.path(), 3, *model, optimizer, "--config");
  ASSERT_OK(saved);
  EXPECT_TRUE(std::filesystem::exists(tmp.Path("ckpt-000000000003/meta.json")));
  EXPECT_THAT(Unfinished(tmp.path()), ::testing::IsEmpty());
}

}  // namespace
}  // namespace asympo::learner
