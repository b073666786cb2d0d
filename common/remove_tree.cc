#include "common/remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace asympo {
namespace {

absl::Status ErrnoStatus(absl::string_view what, const std::string& path, int error) {
  return absl::InternalError(absl::StrCat("cannot ", what, " '", path, "': ", std::strerror(error),
                                          " (errno ", error, ")"));
}

// Removes the entry `name` of the directory open as `dir_fd` (`path` is its
// full name, for messages). Depth-first: one descriptor per level.
void RemoveAt(int dir_fd, const char* name, const std::string& path, absl::Status* first) {
  auto note = [&](absl::string_view what, const std::string& p, int error) {
    if (first->ok()) *first = ErrnoStatus(what, p, error);
  };
  struct stat st;
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) note("inspect", path, errno);
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dir_fd, name, 0) != 0 && errno != ENOENT) note("remove", path, errno);
    return;
  }
  const int fd = ::openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    note("open the directory", path, errno);
    return;
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    note("list", path, errno);
    ::close(fd);
    return;
  }
  while (true) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) note("list", path, errno);
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    RemoveAt(::dirfd(d), e->d_name, absl::StrCat(path, "/", e->d_name), first);
  }
  ::closedir(d);  // closes fd
  if (::unlinkat(dir_fd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
    note("remove the directory", path, errno);
  }
}

}  // namespace

absl::Status RemoveTree(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("RemoveTree: empty path");
  absl::Status first;
  RemoveAt(AT_FDCWD, path.c_str(), path, &first);
  return first;
}

}  // namespace asympo
