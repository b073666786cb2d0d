#include "learner_server/snapshot_publisher.h"

#include <glog/logging.h>

#include "common/status_macros.h"

namespace asympo::learner {

absl::StatusOr<std::unique_ptr<SnapshotPublisher>> SnapshotPublisher::Create(
    broadcast::SnapshotStore* store, const PolicyModel& model, at::ScalarType dtype,
    prometheus::Counter& coalesced, bool device_buckets, bool host_only) {
  // Laid out as the store's buckets. With device_buckets (the NCCL
  // transport and the model on a GPU), NCCL broadcasts straight from the
  // staged device copy.
  ASYMPO_ASSIGN_OR_RETURN(
      std::unique_ptr<broadcast::SnapshotStaging> staging,
      broadcast::SnapshotStaging::Create(model, dtype, *store, device_buckets, host_only));
  return std::unique_ptr<SnapshotPublisher>(
      new SnapshotPublisher(store, std::move(staging), coalesced));
}

SnapshotPublisher::SnapshotPublisher(broadcast::SnapshotStore* store,
                                     std::unique_ptr<broadcast::SnapshotStaging> staging,
                                     prometheus::Counter& coalesced)
    : store_(store), staging_(std::move(staging)), coalesced_counter_(coalesced) {
  thread_ = std::thread([this] { Loop(); });
}

SnapshotPublisher::~SnapshotPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::Status SnapshotPublisher::Publish(uint64_t version, const PolicyModel& model,
                                        const WeightParts& parts) {
  absl::MutexLock lock(&mu_);
  // The staging buffer is free once the thread has copied it out.
  mu_.Await(absl::Condition(
      +[](bool* copying) { return !*copying; }, &copying_));
  absl::Status staged;
  ASYMPO_RETURN_IF_ERROR(StageLocked(model, parts, &staged));
  if (!staged.ok()) {
    LOG(ERROR) << "staging version " << version << " for broadcast failed: " << staged;
    staged_.reset();
    return absl::OkStatus();
  }
  if (staged_.has_value()) {
    ++coalesced_;
    coalesced_counter_.Increment();
    VLOG(1) << "version " << *staged_ << " replaced by " << version << " before broadcast";
  }
  staged_ = version;
  return absl::OkStatus();
}

absl::Status SnapshotPublisher::StageLocked(const PolicyModel& model, const WeightParts& parts,
                                            absl::Status* staged) {
  *staged = staging_->BeginStage();
  // `parts` runs to its end whatever happens: fully sharded, it is a collective.
  ASYMPO_RETURN_IF_ERROR(parts([&](const std::vector<size_t>& params) {
    if (staged->ok()) *staged = staging_->StageParameters(model, params);
    return absl::OkStatus();
  }));
  if (staged->ok()) *staged = staging_->FinishStage();
  return absl::OkStatus();
}

absl::Status SnapshotPublisher::PublishNow(uint64_t version, const PolicyModel& model,
                                           const WeightParts& parts) {
  absl::MutexLock lock(&mu_);
  AwaitIdleLocked();
  absl::Status staged;
  ASYMPO_RETURN_IF_ERROR(StageLocked(model, parts, &staged));
  ASYMPO_RETURN_IF_ERROR(staged);
  ASYMPO_RETURN_IF_ERROR(staging_->CopyToHost().status());
  const broadcast::DeviceBuckets device = staging_->DeviceBucketsOfStage();
  return store_->Publish(version, staging_->HostBucketsOfCopy(),
                         device.data == nullptr ? nullptr : &device);
}

absl::Status SnapshotPublisher::PublishNow(uint64_t version, const PolicyModel& model) {
  return PublishNow(version, model, WholeWeights(model));
}

void SnapshotPublisher::AwaitIdleLocked() {
  mu_.Await(absl::Condition(
      +[](SnapshotPublisher* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !p->staged_.has_value() && !p->copying_ && !p->sending_;
      },
      this));
}

void SnapshotPublisher::Flush() {
  absl::MutexLock lock(&mu_);
  AwaitIdleLocked();
}

int64_t SnapshotPublisher::coalesced() const {
  absl::MutexLock lock(&mu_);
  return coalesced_;
}

void SnapshotPublisher::Loop() {
  while (true) {
    uint64_t version = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SnapshotPublisher* p)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->staged_.has_value() || p->stopping_; },
          this));
      if (!staged_.has_value()) return;  // stopping, nothing left
      version = *staged_;
      staged_.reset();
      copying_ = sending_ = true;
    }
    absl::Status s = CopyAndSend(version);
    if (!s.ok()) LOG(ERROR) << "publishing version " << version << " failed: " << s;
    absl::MutexLock lock(&mu_);
    copying_ = sending_ = false;
  }
}

absl::Status SnapshotPublisher::CopyAndSend(uint64_t version) {
  const absl::Status copied = staging_->CopyToHost().status();
  // Taken before the trainer may stage again: their keep_alive then makes
  // the next stage use other buffers (staged in host memory only, the host
  // buffer is the one the next stage would write).
  const broadcast::DeviceBuckets device =
      copied.ok() ? staging_->DeviceBucketsOfStage() : broadcast::DeviceBuckets();
  const broadcast::HostBuckets host =
      copied.ok() ? staging_->HostBucketsOfCopy() : broadcast::HostBuckets();
  {
    absl::MutexLock lock(&mu_);
    copying_ = false;  // the trainer may stage the next version now
  }
  ASYMPO_RETURN_IF_ERROR(copied);
  // The host copy is already laid out as the store's buckets: it adopts it.
  return store_->Publish(version, host, device.data == nullptr ? nullptr : &device);
}

}  // namespace asympo::learner
