// The token of digit d in the synthetic tasks' vocabulary (addition_task.h:
// digit d is kFirstSymbolId + d), shared by the tests of the tasks that
// write numbers.
#pragma once

#include <cstdint>

#include "rollout_server/tasks/tasks.h"

namespace asympo::testing {

constexpr int32_t DigitId(int d) { return rollout::synthetic::kFirstSymbolId + d; }

}  // namespace asympo::testing
