#include "common/model/safetensors_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace asympo {
namespace {

std::string ErrnoText(int error) {
  return absl::StrCat(std::strerror(error), " (errno ", error, ")");
}

// Linux writes at most 0x7ffff000 bytes per call; stay well under it.
constexpr size_t kMaxWriteChunk = size_t{1} << 30;

}  // namespace

absl::StatusOr<std::shared_ptr<FileMapping>> FileMapping::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot open '", path, "': ", ErrnoText(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", ErrnoText(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    // Private and writable: tensors that alias the mapping may be updated in
    // place (copy-on-write) without touching the file or faulting.
    void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot mmap '", path, "' (", size, " bytes): ", ErrnoText(error)));
    }
    data = static_cast<uint8_t*>(addr);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return std::shared_ptr<FileMapping>(new FileMapping(path, data, size));
}

FileMapping::~FileMapping() {
  if (data_ != nullptr && ::munmap(data_, size_) != 0) {
    PLOG(ERROR) << "munmap of '" << path_ << "' failed";
  }
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::string temp_path = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create '", temp_path, "' to write '", path, "': ", ErrnoText(errno)));
  }
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, temp_path, fd));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(const void* data, size_t size) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat("writer for '", path_, "' is closed"));
  }
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min(size, kMaxWriteChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("cannot write '", temp_path_, "': ", ErrnoText(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat("writer for '", path_, "' is closed"));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot fsync '", temp_path_, "': ", ErrnoText(error)));
  }
  if (::close(fd) != 0) {
    return absl::InternalError(absl::StrCat("cannot close '", temp_path_, "': ", ErrnoText(errno)));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename '", temp_path_, "' to '", path_, "': ", ErrnoText(errno)));
  }
  committed_ = true;
  std::string dir = std::filesystem::path(path_).parent_path().string();
  return SyncDirectory(dir.empty() ? "." : dir);
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open directory '", dir, "' to fsync it: ", ErrnoText(errno)));
  }
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("cannot fsync directory '", dir, "': ", ErrnoText(error)));
  }
  return absl::OkStatus();
}

}  // namespace asympo
