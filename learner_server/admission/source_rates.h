// Per-source rate limits of the Learner service: a token bucket of groups
// for each principal whose groups_per_second is set, so that one generator
// cannot take the learner's whole intake. The bucket holds up to one
// second of the rate, and at least `burst_groups` (a batch of the largest
// size must be able to pass). Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asympo::learner {

class SourceRates {
 public:
  explicit SourceRates(int64_t burst_groups) : burst_groups_(burst_groups) {}

  // Takes `groups` from `source`'s bucket (rate `groups_per_second`; 0: no
  // limit). RESOURCE_EXHAUSTED naming the rate, with *retry_after set to
  // when the bucket will hold enough, when it does not; nothing is taken
  // then.
  absl::Status Admit(const std::string& source, double groups_per_second, int64_t groups,
                     absl::Time now, absl::Duration* retry_after);
  // Gives back `groups` that Admit took but the queue did not keep (a
  // duplicate, a refused or withdrawn push), up to the bucket's size.
  void Refund(const std::string& source, double groups_per_second, int64_t groups);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };
  const int64_t burst_groups_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::learner
