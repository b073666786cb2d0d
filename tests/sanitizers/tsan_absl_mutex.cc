// ThreadSanitizer annotations for Debian's Abseil, linked into the
// ThreadSanitizer test programs only (deploy/run_sanitizers.sh tsan;
// docs/security.md, "Sanitizers").
//
// libabsl_synchronization is not built with ThreadSanitizer, so absl::Mutex
// locks and unlocks with atomics and futexes that ThreadSanitizer never
// sees: every access guarded by an absl::Mutex was reported as a race. This
// file defines absl::Mutex's, absl::CondVar's and absl::Notification's
// out-of-line methods in the test program, where they take precedence over
// the library's for every caller (the project's code, gRPC, Abseil itself),
// and each calls the library's own (dlsym RTLD_NEXT) between the
// annotations an instrumented Abseil makes (__tsan_mutex_pre_lock and
// friends). Accesses between a pre and a post annotation are ignored, which
// also covers the conditions a releasing thread evaluates for its waiters.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define ASYMPO_STR2(x) #x
#define ASYMPO_STR(x) ASYMPO_STR2(x)

// The library's definition of the method whose mangled name, after
// "_ZN4absl<inline namespace>" ("_ZNK..." for a const method), is `tail`.
template <typename F>
F Real(const char* tail, bool is_const = false) {
  const char* ns = ASYMPO_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                           std::to_string(std::strlen(ns)) + ns + tail;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found in Abseil\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

// Set while a thread is inside absl::Notification, whose methods are
// annotated as a whole: some of its own locking calls bind inside the
// library and would be seen half (a lock without its unlock).
thread_local bool in_notification = false;

struct NotificationScope {
  NotificationScope() { in_notification = true; }
  ~NotificationScope() { in_notification = false; }
};

using Cond = absl::Condition;
using Mu = absl::Mutex;
constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;

// A lock that always ends held (Lock, LockWhen...).
template <typename F, typename... Args>
auto Acquire(Mu* mu, unsigned flags, F real, Args... args) {
  if (in_notification) return real(mu, args...);
  __tsan_mutex_pre_lock(mu, flags);
  auto result = real(mu, args...);
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// Released and held again inside the call (Await, CondVar::Wait).
template <typename F, typename Self, typename... Args>
auto Reacquire(Mu* mu, F real, Self* self, Args... args) {
  if (in_notification) return real(self, args...);
  __tsan_mutex_pre_unlock(mu, 0);
  auto result = real(self, args...);
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

void Release(Mu* mu, unsigned flags, void (*real)(Mu*)) {
  if (in_notification) return real(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  real(mu);
  __tsan_mutex_post_unlock(mu, flags);
}

bool Try(Mu* mu, unsigned flags, bool (*real)(Mu*)) {
  if (in_notification) return real(mu);
  __tsan_mutex_pre_lock(mu, flags | kTry);
  const bool locked = real(mu);
  __tsan_mutex_post_lock(mu, flags | kTry | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

// Void-returning calls through the templates above.
struct Unit {};
template <typename... Args>
auto Void(void (*f)(Args...)) {
  return [f](Args... args) {
    f(args...);
    return Unit{};
  };
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  static const auto real = Real<void (*)(Mu*)>("5MutexD1Ev");
  if (!in_notification) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  static const auto real = Void(Real<void (*)(Mu*)>("5Mutex4LockEv"));
  Acquire(this, 0, real);
}
void Mutex::ReaderLock() {
  static const auto real = Void(Real<void (*)(Mu*)>("5Mutex10ReaderLockEv"));
  Acquire(this, kRead, real);
}
void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mu*)>("5Mutex6UnlockEv");
  Release(this, 0, real);
}
void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mu*)>("5Mutex12ReaderUnlockEv");
  Release(this, kRead, real);
}
bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mu*)>("5Mutex7TryLockEv");
  return Try(this, 0, real);
}
bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mu*)>("5Mutex13ReaderTryLockEv");
  return Try(this, kRead, real);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      Void(Real<void (*)(Mu*, const Cond&)>("5Mutex8LockWhenERKNS0_9ConditionE"));
  Acquire(this, 0, real, std::cref(cond));
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real =
      Void(Real<void (*)(Mu*, const Cond&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE"));
  Acquire(this, kRead, real, std::cref(cond));
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<bool (*)(Mu*, const Cond&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Acquire(this, 0, real, std::cref(cond), timeout);
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<bool (*)(Mu*, const Cond&, Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Acquire(this, kRead, real, std::cref(cond), timeout);
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<bool (*)(Mu*, const Cond&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Acquire(this, 0, real, std::cref(cond), deadline);
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<bool (*)(Mu*, const Cond&, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Acquire(this, kRead, real, std::cref(cond), deadline);
}

void Mutex::Await(const Condition& cond) {
  static const auto real = Void(Real<void (*)(Mu*, const Cond&)>("5Mutex5AwaitERKNS0_9ConditionE"));
  Reacquire(this, real, this, std::cref(cond));
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<bool (*)(Mu*, const Cond&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Reacquire(this, real, this, std::cref(cond), timeout);
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<bool (*)(Mu*, const Cond&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Reacquire(this, real, this, std::cref(cond), deadline);
}

void CondVar::Wait(Mutex* mu) {
  static const auto real = Void(Real<void (*)(CondVar*, Mu*)>("7CondVar4WaitEPNS0_5MutexE"));
  Reacquire(mu, real, this, mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mu*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Reacquire(mu, real, this, mu, timeout);
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real =
      Real<bool (*)(CondVar*, Mu*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Reacquire(mu, real, this, mu, deadline);
}

// A notification orders what came before Notify before what follows a wait
// that saw it.
Notification::~Notification() {
  static const auto real = Real<void (*)(Notification*)>("12NotificationD1Ev");
  NotificationScope scope;
  real(this);
}
void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(this);
  NotificationScope scope;
  real(this);
}
void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  {
    NotificationScope scope;
    real(this);
  }
  __tsan_acquire(const_cast<Notification*>(this));
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  bool notified;
  {
    NotificationScope scope;
    notified = real(this, timeout);
  }
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  bool notified;
  {
    NotificationScope scope;
    notified = real(this, deadline);
  }
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
