// Status propagation macros. The Abseil shipped with Debian 12 has no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so the project defines its own, once.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define ASYMPO_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status asympo_status_ = (expr);          \
    if (!asympo_status_.ok()) return asympo_status_; \
  } while (0)

#define ASYMPO_STATUS_CONCAT_INNER_(a, b) a##b
#define ASYMPO_STATUS_CONCAT_(a, b) ASYMPO_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs`, which may be
// a declaration: ASYMPO_ASSIGN_OR_RETURN(auto x, MakeX());
#define ASYMPO_ASSIGN_OR_RETURN(lhs, rexpr) \
  ASYMPO_ASSIGN_OR_RETURN_IMPL_(ASYMPO_STATUS_CONCAT_(asympo_statusor_, __LINE__), lhs, rexpr)

#define ASYMPO_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()
