// Two copies of the rollout daemon's policy: the active one that generation
// samples with, and a spare that takes the next verified snapshot from the
// weight receiver. They swap when the generation thread calls Refresh:
// between static generations, or between two decode steps of continuous
// batching (in-flight updates); a snapshot that fails to
// load leaves the active weights in place (reported to the learner).
//
// Refresh and active() belong to the generation thread; version() may be
// read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <prometheus/counter.h>

#include "absl/time/time.h"
#include "common/log_throttle.h"
#include "common/model/policy_model.h"
#include "weight_broadcaster/broadcast_receiver.h"

namespace asympo::rollout {

class DoubleBufferedPolicy {
 public:
  // `receiver` and `flips` (may be null) must outlive this object.
  DoubleBufferedPolicy(std::unique_ptr<PolicyModel> first, std::unique_ptr<PolicyModel> second,
                       broadcast::WeightReceiver* receiver, prometheus::Counter* flips);

  // Between generations: loads the newest pending snapshot, if any, into the
  // spare model and makes it active. Until a first snapshot arrives it waits
  // up to `wait` for one. Returns whether the active model holds a
  // snapshot of the learner (false: do not sample yet).
  bool Refresh(absl::Duration wait);

  // Whether a verified snapshot waits to be loaded (Refresh would flip).
  bool pending() const { return receiver_->WaitForPending(absl::ZeroDuration()); }

  const PolicyModel& active() const { return *models_[active_]; }
  // The version the active model holds (0 before the first snapshot).
  uint64_t version() const { return version_.load(); }
  // Snapshots loaded so far: active() changed when this did (a restarted
  // learner may send other weights under a version number already held).
  uint64_t loads() const { return loads_; }

 private:
  std::unique_ptr<PolicyModel> models_[2];
  int active_ = 0;
  bool has_weights_ = false;
  broadcast::WeightReceiver* const receiver_;
  prometheus::Counter* const flips_;
  LogThrottle load_log_{absl::Minutes(1)};
  std::atomic<uint64_t> version_{0};
  uint64_t loads_ = 0;
};

}  // namespace asympo::rollout
