// Test helper: a unary gRPC call with raw request bytes, as a client that
// sends something other than the method's message would make it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/synchronization/notification.h"

namespace asympo::testing {

// Calls `method` ("/package.Service/Method") on `channel` with `bytes` as
// the request; returns the status (and the reply's bytes in *reply).
inline grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, const std::string& bytes,
                                 std::string* reply = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (reply != nullptr && status.ok()) {
    grpc::Slice all;
    if (response.DumpToSingleSlice(&all).ok()) {
      reply->assign(reinterpret_cast<const char*>(all.begin()), all.size());
    }
  }
  return status;
}

}  // namespace asympo::testing
