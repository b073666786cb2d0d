#include "common/listener/call_reaper.h"

namespace asympo {

CallReaper::CallReaper(absl::Duration period) : period_(period), thread_([this] { Loop(); }) {}

CallReaper::~CallReaper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

uint64_t CallReaper::Add(grpc::CallbackServerContext* ctx, absl::Duration idle,
                         absl::Duration whole) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  const uint64_t handle = next_++;
  calls_[handle] = Call{
      ctx, idle, whole == absl::InfiniteDuration() ? absl::InfiniteFuture() : now + whole, now};
  return handle;
}

void CallReaper::Touch(uint64_t handle) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(handle);
  if (it != calls_.end()) it->second.last_active = now;
}

void CallReaper::Remove(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  calls_.erase(handle);
}

bool CallReaper::Reaped(uint64_t handle) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(handle);
  return it != calls_.end() && it->second.reaped;
}

int64_t CallReaper::reaped() const {
  absl::MutexLock lock(&mu_);
  return reaped_;
}

void CallReaper::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), period_);
    const absl::Time now = absl::Now();
    for (auto& [handle, call] : calls_) {
      if (call.reaped) continue;
      if (now - call.last_active >= call.idle || now >= call.deadline) {
        call.reaped = true;
        ++reaped_;
        call.ctx->TryCancel();
      }
    }
  }
}

}  // namespace asympo
