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

void AnnouncementStream::OnReadInitialMetadataDone(bool ok) {
  if (!ok) return;
  const auto& md = ctx_.GetServerInitialMetadata();
  if (md.find(kSubscribedMetadataKey) != md.end()) callbacks_.subscribed();
}

void AnnouncementStream::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  callbacks_.announced(std::move(message_));
  message_.Clear();
  StartRead(&message_);
}

void AnnouncementStream::OnDone(const grpc::Status& status) { callbacks_.done(status); }

}  // namespace asympo::broadcast
