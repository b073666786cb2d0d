// Heartbeat: a small file that a learner rank rewrites while its training
// loop makes progress (after each step, and while it waits idle for data:
// an empty queue is not a stall), so that an exec liveness probe can tell a
// rank that trains or waits from one stuck in a step or a collective
// (deploy/kubernetes/base/learner-probe.sh compares the time in the file
// with the clock).
//
// The file holds one line, "<unix seconds> <beats>\n", written to a
// temporary file beside it and renamed over it, so a reader never sees half
// a line. Not thread-safe: one thread (the training loop) calls Beat.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asympo::learner {

class Heartbeat {
 public:
  // Removes a file an earlier process left at `path` (a restarted container
  // keeps its /tmp, and a stale beat would pass the startup probe) and
  // checks that its folder can be written. Errors name the path. The file
  // appears with the first Beat.
  static absl::StatusOr<std::unique_ptr<Heartbeat>> Create(
      std::string path, absl::Duration min_interval = absl::Seconds(1));

  // Writes the beat, at most once per min_interval (the first call always
  // writes). A failed write is returned, and logged when writes begin to
  // fail and when they work again.
  absl::Status Beat(absl::Time now = absl::Now());

  const std::string& path() const { return path_; }
  // Beats written to the file so far.
  int64_t written() const { return written_; }

 private:
  Heartbeat(std::string path, absl::Duration min_interval)
      : path_(std::move(path)), min_interval_(min_interval) {}
  absl::Status Write(absl::Time now);

  const std::string path_;
  const absl::Duration min_interval_;
  absl::Time last_ = absl::InfinitePast();
  int64_t written_ = 0;
  bool failing_ = false;
};

}  // namespace asympo::learner
