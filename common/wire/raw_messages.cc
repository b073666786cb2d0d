#include "common/wire/raw_messages.h"

#include <vector>

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

namespace asympo {
namespace {

// The buffer's slices; `holder` keeps them alive while the views are used.
WireSlices Slices(const grpc::ByteBuffer& raw, std::vector<grpc::Slice>* holder) {
  WireSlices out;
  if (!raw.Dump(holder).ok()) return out;
  out.reserve(holder->size());
  for (const grpc::Slice& s : *holder) {
    out.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace

absl::Status ParseRawRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message,
                             const WireLimits& limits) {
  std::vector<grpc::Slice> holder;
  const WireSlices wire = Slices(raw, &holder);
  absl::Status s = CheckMessageWire(*message->GetDescriptor(), wire, limits);
  if (!s.ok()) return s;
  return ParseCheckedWire(wire, message);
}

absl::Status ParseRawBatch(const grpc::ByteBuffer& raw, const BatchLimits& limits,
                           int64_t max_bytes, v1::RolloutBatch* batch) {
  std::vector<grpc::Slice> holder;
  const WireSlices wire = Slices(raw, &holder);
  absl::Status s = CheckRolloutBatchWire(wire, limits, max_bytes);
  if (!s.ok()) return s;
  return ParseCheckedWire(wire, batch);
}

void SerializeReply(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  bool own = false;
  grpc::ByteBuffer bb;
  (void)grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, &bb, &own);
  out->Swap(&bb);
}

}  // namespace asympo
