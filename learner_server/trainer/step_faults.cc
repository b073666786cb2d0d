#include "learner_server/trainer/step_faults.h"

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace asympo::learner {
namespace {

bool Contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

void StepFaults::Arm() {
  ++steps_;
  nan_ = Contains(nonfinite_loss_steps_, steps_);
  exception_ = Contains(exception_steps_, steps_);
}

void StepFaults::AfterLoss(LossOutput& out) const {
  if (!nan_) return;
  out.loss = out.loss * std::numeric_limits<double>::quiet_NaN();
  out.diagnostics.loss = std::numeric_limits<double>::quiet_NaN();
}

void StepFaults::AfterBackward() const {
  if (exception_) TORCH_CHECK(false, "injected fault (--fault_exception_steps)");
}

}  // namespace asympo::learner
