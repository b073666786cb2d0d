// Why a training step was skipped, carried beside its status.
//
// Trainer::Step returns a StepOr<StepResult>: an absl::StatusOr whose failure
// also names its SkipReason, the label of
// asympo_learner_steps_skipped_total{reason}. The reasons that only the
// trainer can tell (a non-finite loss or gradient, poisoned groups) are set
// where the failure is made (StepFailure); a failure made from a plain
// absl::Status (a LibTorch exception turned into one, a bad batch) takes its
// reason from its code (SkipReasonOfCode).
#pragma once

#include <cstddef>
#include <iterator>
#include <ostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asympo::learner {

enum class SkipReason {
  kNonFiniteLoss,      // overflowing weights or activations
  kNonFiniteGradient,  // the same, seen in the gradient's norm
  kInvalidBatch,       // bad data that slipped past validation
  kOutOfMemory,
  kTorchError,  // any other LibTorch error
  // Every group of the step made it non-finite by its rewards
  // (StepResult::dropped, trainer_isolation.cc): the sources' fault, not the
  // learner's.
  kPoisonedGroups,
};

// Every reason, in the order above.
inline constexpr SkipReason kSkipReasons[] = {
    SkipReason::kNonFiniteLoss, SkipReason::kNonFiniteGradient, SkipReason::kInvalidBatch,
    SkipReason::kOutOfMemory,   SkipReason::kTorchError,        SkipReason::kPoisonedGroups};
inline constexpr size_t kNumSkipReasons = std::size(kSkipReasons);

// The metric label: "nonfinite_loss", "nonfinite_gradient", "invalid_batch",
// "out_of_memory", "torch_error", "poisoned_groups".
absl::string_view SkipReasonLabel(SkipReason reason);
inline std::ostream& operator<<(std::ostream& os, SkipReason reason) {
  return os << SkipReasonLabel(reason);
}

// The reason of a failure that was not given one: RESOURCE_EXHAUSTED is out
// of memory, INVALID_ARGUMENT an invalid batch, any other code a LibTorch
// error.
SkipReason SkipReasonOfCode(absl::StatusCode code);

// A skipped step: what went wrong, and why it counts as it does.
struct StepFailure {
  absl::Status status;  // not OK
  SkipReason reason = SkipReason::kTorchError;
};

// A T, or the StepFailure that skipped the step. Reads as an absl::StatusOr
// (ok(), status(), value(), ->), with reason() and failure() besides.
template <typename T>
class StepOr : public absl::StatusOr<T> {
 public:
  StepOr() = default;                                       // an UNKNOWN error, as absl::StatusOr's
  StepOr(T value) : absl::StatusOr<T>(std::move(value)) {}  // NOLINT: implicit, as StatusOr's
  StepOr(StepFailure failure)  // NOLINT: implicit, so that a function can return one
      : absl::StatusOr<T>(std::move(failure.status)), reason_(failure.reason) {}
  // A failure whose reason follows from its code (SkipReasonOfCode).
  StepOr(absl::Status status)  // NOLINT: implicit, as StatusOr's
      : absl::StatusOr<T>(std::move(status)), reason_(SkipReasonOfCode(this->status().code())) {}

  const absl::Status& status() const& { return absl::StatusOr<T>::status(); }
  // Deleted so that ASYMPO_ASSIGN_OR_RETURN, which would keep the status and
  // drop the reason, does not compile on a StepOr: return failure() instead.
  absl::Status status() && = delete;

  // Meaningful when !ok().
  SkipReason reason() const { return reason_; }
  StepFailure failure() const { return {status(), reason_}; }

 private:
  SkipReason reason_ = SkipReason::kTorchError;
};

}  // namespace asympo::learner
