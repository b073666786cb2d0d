// LibTorch exceptions as absl::Status, at the boundary where the daemons'
// libraries call LibTorch. Every public function of common/model,
// learner_server and rollout_server that runs tensor code and returns a
// Status goes through GuardTorch, so that a c10::Error (a shape mismatch, a
// CUDA error, an out-of-memory) reaches the daemon as an error it can count,
// log and survive instead of an exception that ends the process.
#pragma once

#include <exception>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asympo {

// The status for an exception thrown while doing `what` (e.g. "generation"):
// RESOURCE_EXHAUSTED for an out-of-memory error (c10::OutOfMemoryError or
// std::bad_alloc), INVALID_ARGUMENT for c10's index/value/type errors,
// INTERNAL otherwise. The message is "<what>: <first line of the error>"
// (LibTorch appends a C++ backtrace that an operator does not need).
absl::Status StatusFromException(const std::exception& e, absl::string_view what);
// For `catch (...)`: INTERNAL "<what>: unknown exception".
absl::Status StatusFromUnknownException(absl::string_view what);

// Runs `fn` (returning absl::Status or absl::StatusOr<T>) and turns any
// exception it throws into that type's error.
template <typename Fn>
auto GuardTorch(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  using Result = decltype(fn());
  static_assert(
      std::is_same_v<Result, absl::Status> || std::is_constructible_v<Result, absl::Status>,
      "GuardTorch needs a function returning absl::Status or absl::StatusOr<T>");
  try {
    return std::forward<Fn>(fn)();
  } catch (const std::exception& e) {
    return Result(StatusFromException(e, what));
  } catch (...) {
    return Result(StatusFromUnknownException(what));
  }
}

}  // namespace asympo
