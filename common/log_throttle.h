// LogThrottle: lets one kind of log line through at most once per interval
// and counts the lines it held back, for the next one that goes through. A
// client that repeats a request in a loop (registers again and again,
// reports the same failure) then costs the log a line every 10 s, not one
// per call.
//
//   LogThrottle throttle;  // one per kind of line
//   int64_t held_back = 0;
//   if (throttle.Allow(&held_back)) {
//     LOG(WARNING) << "receiver ... reports: ..." << throttle.HeldBack(held_back);
//   }
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asympo {

class LogThrottle {
 public:
  explicit LogThrottle(absl::Duration interval = absl::Seconds(10)) : interval_(interval) {}

  // Whether a line may go out at `now`: the first one does, and then one
  // per interval. When it may, `*held_back` is the number of lines held
  // back since the last one that went out.
  bool Allow(int64_t* held_back, absl::Time now = absl::Now()) {
    absl::MutexLock lock(&mu_);
    if (now - last_ < interval_) {
      ++held_back_;
      return false;
    }
    *held_back = held_back_;
    held_back_ = 0;
    last_ = now;
    return true;
  }

  // The end of a line that went out: empty, or how many were held back.
  std::string HeldBack(int64_t held_back) const {
    if (held_back == 0) return "";
    return absl::StrCat(" (", held_back, " more such lines held back in the last ",
                        absl::FormatDuration(interval_), " or so)");
  }

 private:
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace asympo
