// The weight group's c10d store, reached by the members through the Store
// call (weight_group.h): the request's limits, and one store operation
// with c10d's semantics, which never waits: a GET or WAIT whose keys are
// not all set answers ready = false, and the call is parked until they are
// (for at most kMaxStoreWaitMs); and the store of one generation, which
// holds what its members set within limits (GenerationStore).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <grpcpp/grpcpp.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_group.grpc.pb.h"
#include "common/wire/wire_check.h"
#include "weight_broadcaster/weight_group/weight_group.h"

namespace asympo::broadcast {

inline constexpr size_t kMaxWorkerIdBytes = 128;
inline constexpr int kMaxStoreKeys = 64;
inline constexpr size_t kMaxStoreKeyBytes = 512;
inline constexpr size_t kMaxStoreValueBytes = 1u << 20;
inline constexpr size_t kMaxMemberTokenBytes = 64;
inline constexpr size_t kMaxSignatureBytes = 256;
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

// INVALID_ARGUMENT naming member_token when it is empty or over
// kMaxMemberTokenBytes.
grpc::Status CheckMemberToken(const std::string& token);

// INVALID_ARGUMENT naming the field or limit a request breaks: the member
// token, the op, key count and sizes, value sizes, one key for the one-key
// operations.
grpc::Status CheckStoreRequest(const v1::GroupStoreRequest& r);

// One store operation on `store` (c10d's semantics, without waiting); a
// failed one is INVALID_ARGUMENT with c10d's first line.
grpc::Status RunStoreOp(c10d::Store& store, const v1::GroupStoreRequest& r,
                        v1::GroupStoreResponse* response);

// The store of one generation (or of one trial: weight_group.h) with what
// the members set in it counted against the options' limits, in all and by
// member. Rank 0's own process group sets its keys on store() directly,
// uncounted. Thread-safe.
class GenerationStore {
 public:
  // The limits of `options`, which must outlive it.
  explicit GenerationStore(const WeightGroupOptions& options);

  // The c10d store (a HashStore) rank 0's process group is built on.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // Runs `r` for the member whose token is `member` (`worker` names it in
  // messages), as RunStoreOp, after two checks: a SET, COMPARE_SET or
  // DELETE of a key that another rank set is PERMISSION_DENIED (cause
  // "store_key_owner"; ADD may count on any key), and a SET, ADD or
  // COMPARE_SET that would take the store or the member past its bytes or
  // keys is RESOURCE_EXHAUSTED naming the limit (cause "store_bytes" or
  // "store_keys"). `*cause` is left empty otherwise.
  grpc::Status Run(const std::string& member, const std::string& worker,
                   const v1::GroupStoreRequest& r, v1::GroupStoreResponse* response,
                   std::string* cause);

 private:
  struct Usage {
    int64_t bytes = 0;
    int keys = 0;
  };
  struct Key {
    std::string member;
    int64_t bytes = 0;
  };
  // OK when `member` may make key `key` hold `bytes` (key included).
  grpc::Status RoomLocked(const std::string& member, const std::string& worker,
                          const std::string& key, int64_t bytes, std::string* cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records what key `key` holds now (absent: deleted).
  void RecordLocked(const std::string& member, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WeightGroupOptions& options_;
  const c10::intrusive_ptr<c10d::Store> store_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Key> keys_ ABSL_GUARDED_BY(mu_);  // set through Store
  Usage total_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> by_member_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asympo::broadcast
