#include "rollout_server/engine/double_buffered_policy.h"

#include <string>
#include <utility>

#include <glog/logging.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "weight_broadcaster/broadcast_metrics.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::rollout {

DoubleBufferedPolicy::DoubleBufferedPolicy(std::unique_ptr<PolicyModel> first,
                                           std::unique_ptr<PolicyModel> second,
                                           broadcast::WeightReceiver* receiver,
                                           prometheus::Counter* flips)
    : models_{std::move(first), std::move(second)}, receiver_(receiver), flips_(flips) {}

bool DoubleBufferedPolicy::Refresh(absl::Duration wait) {
  if (!has_weights_ && !receiver_->WaitForPending(wait)) return false;
  std::shared_ptr<const broadcast::ReceivedSnapshot> snapshot = receiver_->TakePending();
  if (snapshot == nullptr) return has_weights_;
  PolicyModel* spare = models_[1 - active_].get();
  const absl::Time start = absl::Now();
  const absl::Status s = broadcast::LoadSnapshotIntoModel(*snapshot, spare);
  if (!s.ok()) {
    LOG(ERROR) << "snapshot " << snapshot->version() << " not loaded: " << s;
    receiver_->ReportLoadFailure(snapshot->version(), std::string(s.message()));
    return has_weights_;
  }
  active_ = 1 - active_;
  has_weights_ = true;
  version_ = snapshot->version();
  ++loads_;
  receiver_->ReportLoaded(snapshot->version(), absl::ToDoubleSeconds(absl::Now() - start));
  if (flips_ != nullptr) flips_->Increment();
  int64_t held_back = 0;
  if (load_log_.Allow(&held_back)) {  // the first load, then at most one line a minute
    LOG(INFO) << "sampling with version " << snapshot->version() << " (weights digest "
              << broadcast::WeightDigest(snapshot->manifest) << ")"
              << load_log_.HeldBack(held_back);
  }
  return true;
}

}  // namespace asympo::rollout
