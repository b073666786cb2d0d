// The weight group's c10d store, reached by the members through the Store
// call (weight_group.h): the request's limits, and one store operation
// with c10d's semantics, which never waits: a GET or WAIT whose keys are
// not all set answers ready = false, and the call is parked until they are
// (for at most kMaxStoreWaitMs).
#pragma once

#include <chrono>
#include <cstdint>

#include <grpcpp/grpcpp.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include "absl/time/time.h"
#include "asympo/v1/weight_group.grpc.pb.h"
#include "common/wire/wire_check.h"

namespace asympo::broadcast {

inline constexpr size_t kMaxWorkerIdBytes = 128;
inline constexpr int kMaxStoreKeys = 64;
inline constexpr size_t kMaxStoreKeyBytes = 512;
inline constexpr size_t kMaxStoreValueBytes = 1u << 20;
inline constexpr uint32_t kMaxWaitMs = 60000;
inline constexpr uint32_t kMaxStoreWaitMs = 30000;
inline constexpr uint32_t kDefaultWaitMs = 10000;

// `d` in whole milliseconds, as c10d's stores and collectives take it.
inline std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// The wire limits of a store request: two values of kMaxStoreValueBytes and
// the keys.
WireLimits StoreWireLimits();

// Whether `r` waits for its keys (GET, WAIT).
bool IsStoreWait(const v1::GroupStoreRequest& r);

// A request's wait: `ms` (0: kDefaultWaitMs), at most `cap`.
absl::Duration WaitOf(uint32_t ms, uint32_t cap);

// INVALID_ARGUMENT naming the limit a request breaks: key count and sizes,
// value sizes, one key for the one-key operations.
grpc::Status CheckStoreRequest(const v1::GroupStoreRequest& r);

// One store operation on `store` (c10d's semantics, without waiting); a
// failed one is INVALID_ARGUMENT with c10d's first line.
grpc::Status RunStoreOp(c10d::Store& store, const v1::GroupStoreRequest& r,
                        v1::GroupStoreResponse* response);

}  // namespace asympo::broadcast
