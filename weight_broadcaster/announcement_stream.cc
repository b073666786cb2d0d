#include "weight_broadcaster/announcement_stream.h"

#include <utility>

#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {

AnnouncementStream::AnnouncementStream(v1::WeightBroadcast::Stub* stub, Callbacks callbacks)
    : stub_(stub), callbacks_(std::move(callbacks)) {}

void AnnouncementStream::Start(const std::string& session_id) {
  request_.set_session_id(session_id);
  request_.set_after_version(0);
  stub_->async()->Subscribe(&ctx_, &request_, this);
  StartRead(&message_);
  StartCall();
}

// gRPC may run the two reactions below on different threads in either
// order, although the metadata arrives first: an announcement read before the
// metadata's reaction has run waits for it, so that `subscribed` always comes
// before the first `announced`.
void AnnouncementStream::OnReadInitialMetadataDone(bool ok) {
  absl::MutexLock lock(&mu_);
  metadata_done_ = true;
  if (ok) {
    const auto& md = ctx_.GetServerInitialMetadata();
    if (md.find(kSubscribedMetadataKey) != md.end()) callbacks_.subscribed();
  }
  if (parked_) {
    parked_ = false;
    Deliver();
  }
}

void AnnouncementStream::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  absl::MutexLock lock(&mu_);
  if (!metadata_done_) {
    parked_ = true;
    return;
  }
  Deliver();
}

void AnnouncementStream::Deliver() {
  callbacks_.announced(std::move(message_));
  message_.Clear();
  StartRead(&message_);
}

void AnnouncementStream::OnDone(const grpc::Status& status) { callbacks_.done(status); }

}  // namespace asympo::broadcast
