#include "common/remove_tree.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace asympo {
namespace {

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

void Touch(const std::string& p) { std::ofstream(p) << "x"; }

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "remove_tree_XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  return tmpl;
}

TEST(RemoveTreeTest, RemovesANestedTreeAndLeavesWhatLinksPointTo) {
  const std::string root = TempDir();
  const std::string outside = root + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0700), 0);
  Touch(outside + "/keep.txt");
  const std::string tree = root + "/ckpt-000000000200";
  ASSERT_EQ(::mkdir(tree.c_str(), 0700), 0);
  std::string dir = tree;
  for (int depth = 0; depth < 20; ++depth) {
    Touch(dir + "/state.safetensors");
    Touch(dir + "/meta.json");
    dir += "/d" + std::to_string(depth);
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  }
  ASSERT_EQ(::symlink(outside.c_str(), (tree + "/link-to-dir").c_str()), 0);
  ASSERT_EQ(::symlink((outside + "/keep.txt").c_str(), (tree + "/link-to-file").c_str()), 0);
  ASSERT_EQ(::symlink("/nonexistent", (tree + "/dangling").c_str()), 0);
  ASSERT_EQ(::mkfifo((tree + "/fifo").c_str(), 0600), 0);

  EXPECT_TRUE(RemoveTree(tree).ok());
  EXPECT_FALSE(Exists(tree));
  EXPECT_TRUE(Exists(outside + "/keep.txt"));  // links are removed, not followed
  EXPECT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
}

TEST(RemoveTreeTest, AFileALinkAndAMissingPath) {
  const std::string root = TempDir();
  Touch(root + "/file");
  EXPECT_TRUE(RemoveTree(root + "/file").ok());
  EXPECT_FALSE(Exists(root + "/file"));
  // A link to a directory: the link goes, the directory stays.
  ASSERT_EQ(::mkdir((root + "/dir").c_str(), 0700), 0);
  Touch(root + "/dir/inside");
  ASSERT_EQ(::symlink((root + "/dir").c_str(), (root + "/link").c_str()), 0);
  EXPECT_TRUE(RemoveTree(root + "/link").ok());
  EXPECT_FALSE(Exists(root + "/link"));
  EXPECT_TRUE(Exists(root + "/dir/inside"));
  EXPECT_TRUE(RemoveTree(root + "/missing").ok());
  EXPECT_TRUE(RemoveTree(root + "/missing/below").ok());
  EXPECT_FALSE(RemoveTree("").ok());
  EXPECT_TRUE(RemoveTree(root).ok());
}

TEST(RemoveTreeTest, NamesThePathItCannotRemove) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may remove anything";
  const std::string root = TempDir();
  const std::string locked = root + "/locked";
  ASSERT_EQ(::mkdir(locked.c_str(), 0700), 0);
  Touch(locked + "/a");
  ASSERT_EQ(::chmod(locked.c_str(), 0500), 0);  // entries cannot be unlinked
  const absl::Status s = RemoveTree(root);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(locked + "/a"), std::string::npos) << s;
  ASSERT_EQ(::chmod(locked.c_str(), 0700), 0);
  EXPECT_TRUE(RemoveTree(root).ok());
}

}  // namespace
}  // namespace asympo
