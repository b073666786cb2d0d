// The receiver's end of Subscribe: a gRPC client read reactor that hands
// each announcement to a callback. The callbacks run on gRPC's
// threads and must not block; `subscribed` runs before the first
// `announced`, and none of them runs while another does.
//
// Lifetime: the owner keeps the stream alive until `done` has been called;
// gRPC touches neither the stream nor its context after that, so the owner
// may then destroy it. Cancel with context()->TryCancel().
#pragma once

#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "asympo/v1/weight_broadcast.grpc.pb.h"

namespace asympo::broadcast {

class AnnouncementStream final : public grpc::ClientReadReactor<v1::SnapshotAnnouncement> {
 public:
  struct Callbacks {
    // The learner accepted the subscription (its initial metadata carries
    // kSubscribedMetadataKey).
    std::function<void()> subscribed;
    // A new version was announced.
    std::function<void(v1::SnapshotAnnouncement)> announced;
    // The stream ended (last call).
    std::function<void(const grpc::Status&)> done;
  };

  // `stub` must outlive the stream.
  AnnouncementStream(v1::WeightBroadcast::Stub* stub, Callbacks callbacks);

  grpc::ClientContext* context() { return &ctx_; }
  // Subscribes from the start (after_version 0: the latest version is
  // announced at once, whatever it is).
  void Start(const std::string& session_id);

  void OnReadInitialMetadataDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Hands message_ to `announced` and reads the next one.
  void Deliver() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  v1::WeightBroadcast::Stub* const stub_;
  const Callbacks callbacks_;
  grpc::ClientContext ctx_;
  v1::SubscribeRequest request_;
  absl::Mutex mu_;                    // serializes the reactions' callbacks
  v1::SnapshotAnnouncement message_;  // the read under way, or parked
  bool metadata_done_ ABSL_GUARDED_BY(mu_) = false;
  bool parked_ ABSL_GUARDED_BY(mu_) = false;  // message_ read before the metadata's reaction
};

}  // namespace asympo::broadcast
