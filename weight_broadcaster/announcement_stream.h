// The receiver's end of Subscribe: a gRPC client read reactor that hands
// each announcement to a callback. The callbacks run on gRPC's
// threads and must not block.
//
// Lifetime: the owner keeps the stream alive until `done` has been called;
// gRPC touches neither the stream nor its context after that, so the owner
// may then destroy it. Cancel with context()->TryCancel().
#pragma once

#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

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
  v1::WeightBroadcast::Stub* const stub_;
  const Callbacks callbacks_;
  grpc::ClientContext ctx_;
  v1::SubscribeRequest request_;
  v1::SnapshotAnnouncement message_;
};

}  // namespace asympo::broadcast
