// Requests and replies of the raw (grpc::ByteBuffer) gRPC methods the
// learner serves: each request is checked on the wire (common/wire/wire_check.h)
// before it is parsed, and each reply is serialized here. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "asympo/v1/rollout.pb.h"
#include "common/batch_validation.h"
#include "common/wire/wire_check.h"

namespace asympo {

// Checks `raw` with CheckMessageWire against `limits`, then parses it into
// `message`. INVALID_ARGUMENT naming the message type and the fault.
absl::Status ParseRawRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message,
                             const WireLimits& limits = {});

// Checks `raw` with CheckRolloutBatchWire, then parses it into `batch`.
// INVALID_ARGUMENT as CheckRolloutBatchWire.
absl::Status ParseRawBatch(const grpc::ByteBuffer& raw, const BatchLimits& limits,
                           int64_t max_bytes, v1::RolloutBatch* batch);

// `message` serialized into `out` (replacing its contents).
void SerializeReply(const google::protobuf::Message& message, grpc::ByteBuffer* out);

// Adds the size of `raw` to `*received` (when not null): the bytes of every
// request a daemon has taken in, whatever became of it, for the release of
// the memory that requests leave behind (common/daemon/heap_release.h).
inline void CountReceived(std::atomic<int64_t>* received, const grpc::ByteBuffer& raw) {
  if (received != nullptr) {
    received->fetch_add(static_cast<int64_t>(raw.Length()), std::memory_order_relaxed);
  }
}

}  // namespace asympo
