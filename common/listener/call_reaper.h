// Server-side time limits for long-lived gRPC calls (streams): a call that
// stays idle longer than its idle limit, or lasts longer than its whole
// limit, is cancelled (ServerContext::TryCancel), so that calls a client
// opens and never uses do not hold their reactor, buffers or snapshot for
// good. One thread checks every `period`.
//
// A reactor adds its call when it starts, touches it on activity and
// removes it before it is deleted (in OnDone): TryCancel is only called on
// calls that are still added, under the reaper's lock. Thread-safe.
#pragma once

#include <cstdint>
#include <thread>

#include <grpcpp/server_context.h>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asympo {

class CallReaper {
 public:
  explicit CallReaper(absl::Duration period = absl::Milliseconds(250));
  ~CallReaper();  // stops the thread; calls still added are left alone

  // Adds `ctx`, to be cancelled once idle for `idle` or alive for `whole`
  // (an infinite duration: no such limit). Returns a handle for Touch and
  // Remove.
  uint64_t Add(grpc::CallbackServerContext* ctx, absl::Duration idle, absl::Duration whole);
  // The call did something (a message read or written): its idle time
  // starts again.
  void Touch(uint64_t handle);
  // Forgets the call; no effect for an unknown handle.
  void Remove(uint64_t handle);
  // Whether the reaper cancelled the call of `handle` (still added).
  bool Reaped(uint64_t handle) const;

  // Calls cancelled so far.
  int64_t reaped() const;

 private:
  struct Call {
    grpc::CallbackServerContext* ctx;
    absl::Duration idle;
    absl::Time deadline;  // of the whole call
    absl::Time last_active;
    bool reaped = false;
  };
  void Loop();

  const absl::Duration period_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Call> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t reaped_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace asympo
