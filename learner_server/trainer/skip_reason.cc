#include "learner_server/trainer/skip_reason.h"

namespace asympo::learner {

absl::string_view SkipReasonLabel(SkipReason reason) {
  switch (reason) {
    case SkipReason::kNonFiniteLoss:
      return "nonfinite_loss";
    case SkipReason::kNonFiniteGradient:
      return "nonfinite_gradient";
    case SkipReason::kInvalidBatch:
      return "invalid_batch";
    case SkipReason::kOutOfMemory:
      return "out_of_memory";
    case SkipReason::kTorchError:
      return "torch_error";
    case SkipReason::kPoisonedGroups:
      return "poisoned_groups";
  }
  return "torch_error";  // unreachable: every enumerator is handled above
}

SkipReason SkipReasonOfCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kResourceExhausted:
      return SkipReason::kOutOfMemory;
    case absl::StatusCode::kInvalidArgument:
      return SkipReason::kInvalidBatch;
    default:
      return SkipReason::kTorchError;
  }
}

}  // namespace asympo::learner
