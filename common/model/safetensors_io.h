// File primitives under the safetensors reader and writers: a private memory
// mapping of a whole file, and a writer that replaces a file atomically.
//
// FileMapping is immutable once opened and safe to share between threads (it
// is held by std::shared_ptr so that tensors aliasing it keep it alive).
// AtomicFileWriter is not thread-safe: one thread writes one file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace asympo {

// A whole regular file mapped MAP_PRIVATE with PROT_READ | PROT_WRITE. The file
// is opened read-only and never changes: a write through data() lands on a
// private copy of the page (copy-on-write), visible to this process only.
class FileMapping {
 public:
  // NOT_FOUND when `path` does not exist; FAILED_PRECONDITION when it is not a
  // regular file; INTERNAL when open/mmap fails otherwise. An empty file maps
  // to data() == nullptr, size() == 0.
  static absl::StatusOr<std::shared_ptr<FileMapping>> Open(const std::string& path);

  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  const std::string& path() const { return path_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  FileMapping(std::string path, uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  const std::string path_;
  uint8_t* const data_;
  const size_t size_;
};

// Writes a new file beside `path` (same directory, name `path`.tmp.<pid>.<n>)
// and, on Commit(), fsyncs it, renames it over `path` and fsyncs the
// directory, so that a reader sees either the old file or the whole new one,
// also after a crash. Destroying the writer before Commit() removes the
// temporary file. The new file gets mode 0644 less the process umask.
class AtomicFileWriter {
 public:
  // INTERNAL (naming the temporary path and errno) when it cannot be created,
  // e.g. because the directory does not exist.
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path);

  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends `size` bytes; handles short writes and EINTR.
  absl::Status Append(const void* data, size_t size);
  absl::Status Append(std::string_view bytes) { return Append(bytes.data(), bytes.size()); }

  // Makes the file durable and visible under `path`. The writer is spent
  // afterwards, whatever the outcome.
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

  const std::string path_;
  const std::string temp_path_;
  int fd_;  // -1 once closed
  bool committed_ = false;
};

// fsyncs the directory `dir` so that renames and unlinks in it are durable.
absl::Status SyncDirectory(const std::string& dir);

}  // namespace asympo
