#include "learner_server/heartbeat.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asympo::learner {
namespace {

std::string Folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status Errno(const std::string& what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Heartbeat>> Heartbeat::Create(std::string path,
                                                             absl::Duration min_interval) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat file \"", path, "\": expected a file name"));
  }
  const std::string folder = Folder(path);
  if (access(folder.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat file ", path, ": its folder ", folder,
                                                   " cannot be written (", std::strerror(errno),
                                                   ")"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat file ", path, ": cannot remove the one left by an earlier run (",
                     std::strerror(errno), ")"));
  }
  return std::unique_ptr<Heartbeat>(new Heartbeat(std::move(path), min_interval));
}

absl::Status Heartbeat::Beat(absl::Time now) {
  if (now - last_ < min_interval_) return absl::OkStatus();
  absl::Status s = Write(now);
  if (!s.ok()) {
    if (!failing_)
      LOG(WARNING) << "heartbeat: " << s.message() << " (the liveness probe will fail)";
    failing_ = true;
    return s;
  }
  if (failing_) LOG(INFO) << "heartbeat: " << path_ << " written again";
  failing_ = false;
  last_ = now;
  ++written_;
  return absl::OkStatus();
}

absl::Status Heartbeat::Write(absl::Time now) {
  const std::string tmp = path_ + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return Errno(absl::StrCat("cannot write ", tmp), errno);
  const std::string line = absl::StrFormat("%d %d\n", absl::ToUnixSeconds(now), written_ + 1);
  const bool wrote = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    return Errno(absl::StrCat("cannot write ", tmp), wrote ? errno : err);
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int rename_err = errno;
    std::remove(tmp.c_str());
    return Errno(absl::StrCat("cannot rename ", tmp, " to ", path_), rename_err);
  }
  return absl::OkStatus();
}

}  // namespace asympo::learner
