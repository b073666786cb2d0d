// The daemons' adapter flags (--lora_rank, --lora_alpha, --lora_targets) as
// LoraOptions (common/model/lora.h).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/lora.h"

namespace asympo {

// alpha 0 means twice the rank; targets are ignored with rank 0. Validated
// (ValidateLoraOptions): INVALID_ARGUMENT names the flag.
absl::StatusOr<LoraOptions> LoraFromFlags(int64_t rank, double alpha, absl::string_view targets);

}  // namespace asympo
