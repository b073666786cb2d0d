// Groups for the learner's queue in its tests: `n` groups whose prompt ids
// are `tag`0, `tag`1, ..., and a deadline no push in a test comes near.
#pragma once

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "learner_server/admission/group_queue.h"

namespace asympo::testing {

inline std::vector<learner::QueuedGroup> TaggedGroups(int n, const std::string& tag) {
  std::vector<learner::QueuedGroup> out(n);
  for (int i = 0; i < n; ++i) out[i].group.set_prompt_id(tag + std::to_string(i));
  return out;
}

inline absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

}  // namespace asympo::testing
