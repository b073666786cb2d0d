// Fault injection into a trainer's steps, for tests and drills only
// (TrainerOptions::fault_*, the learner's --fault_* flags): the Nth step
// attempt (1-based, counted by the trainer) gets a NaN loss, or a c10::Error
// thrown after its first micro-batch's backward pass.
//
// Not thread-safe: the trainer's thread owns it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "learner_server/loss/policy_loss.h"

namespace asympo::learner {

class StepFaults {
 public:
  StepFaults(std::vector<int64_t> nonfinite_loss_steps, std::vector<int64_t> exception_steps)
      : nonfinite_loss_steps_(std::move(nonfinite_loss_steps)),
        exception_steps_(std::move(exception_steps)) {}

  // Counts a step attempt and arms its faults.
  void Arm();
  // After a micro-batch's loss: makes it NaN when armed.
  void AfterLoss(LossOutput& out) const;
  // After a micro-batch's backward pass: throws a c10::Error when armed.
  void AfterBackward() const;

 private:
  std::vector<int64_t> nonfinite_loss_steps_, exception_steps_;
  int64_t steps_ = 0;
  bool nan_ = false, exception_ = false;  // this step's faults
};

}  // namespace asympo::learner
