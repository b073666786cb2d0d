// The data-parallel exchange of a training step (Trainer::StepShard): what
// each rank adds up with the others before every rank clips and updates
// alike. A typed struct, flattened into one vector of doubles for one
// StepReducer::SumValues call (SumAcrossRanks); the gradients themselves
// go through StepReducer::SumGradients, or the sharded optimizer.
//
// Compiled with or without Gloo (DataParallel implements StepReducer).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "learner_server/loss/loss_diagnostics.h"
#include "learner_server/trainer/skip_reason.h"

namespace asympo::learner {

// Sums a step across data-parallel ranks (DataParallel). Each call is a
// collective: every rank makes the same calls in the same order.
class StepReducer {
 public:
  virtual ~StepReducer() = default;
  // Sums `values` element-wise across ranks, in place.
  virtual absl::Status SumValues(std::vector<double>* values) = 0;
  // Sums the tensors across ranks, in place (same shapes on every rank).
  virtual absl::Status SumGradients(const std::vector<at::Tensor>& gradients) = 0;
};

// One rank's share of a step; after SumAcrossRanks, the whole step's.
struct StepExchange {
  // The rank's micro-batches' diagnostics (zero on a rank that failed); the
  // sums add up, gpg_alpha does not (see gpg_alpha below).
  DiagnosticSums diagnostics;
  int64_t tokens = 0;  // prompt + response tokens processed
  int64_t micro_batches = 0;
  // gpg's alpha on a rank with groups (0 elsewhere), and the ranks with
  // groups: the step's alpha is their mean.
  double gpg_alpha = 0;
  int64_t ranks_with_groups = 0;
  // Ranks that failed, per SkipReason.
  std::array<int64_t, kNumSkipReasons> failures{};
  // Per parameter: ranks that have a gradient for it.
  std::vector<int64_t> has_gradient;

  // The first reason (in SkipReason order) that some rank failed for.
  std::optional<SkipReason> failure() const;
  // The step's diagnostics: the sums pooled, gpg's alpha averaged over the
  // ranks with groups (1 when none has).
  LossDiagnostics Pooled() const;
};

// Sums `exchange` element-wise across the ranks, in place, in one
// SumValues call. Every rank's has_gradient has the same length. A failed
// collective's status passes through, leaving `exchange` unspecified.
absl::Status SumAcrossRanks(StepReducer& reducer, StepExchange& exchange);

}  // namespace asympo::learner
