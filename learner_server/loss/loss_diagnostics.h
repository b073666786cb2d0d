// A step's diagnostics pooled from its micro-batches' (and, data-parallel,
// from its ranks').
//
// PolicyLoss gives each micro-batch's LossDiagnostics as means over that
// micro-batch. DiagnosticSums holds them as sums (a mean times its count,
// the per-group tensors summed), which add up across micro-batches and
// across ranks alike; Pooled() turns the sums back into the step's means.
#pragma once

#include <cstdint>

#include "learner_server/loss/policy_loss.h"

namespace asympo::learner {

struct DiagnosticSums {
  double loss = 0;
  double positive_mass = 0;  // sum_p B_p
  double s_pos = 0;          // sum_p B_p S_P,p
  double s_neg = 0;          // sum_p B_p S_N,p
  double imbalance = 0;      // sum_p Delta_p
  double clip_low = 0;       // clipped tokens, low bound
  double clip_high = 0;
  double nll = 0;                // token NLLs
  double response_length = 0;    // response tokens
  double reward = 0;             // rewards
  double reward_squared = 0;     // squared rewards
  double degenerate_groups = 0;  // groups whose rewards are all equal
  int64_t groups = 0;
  int64_t responses = 0;
  int64_t tokens = 0;
  // Not a sum: gpg's alpha of the last micro-batch added (1 before any).
  double gpg_alpha = 1.0;

  void Add(const LossDiagnostics& d);
  // The step's diagnostics (the per-group and per-response tensors unset).
  LossDiagnostics Pooled() const;
};

}  // namespace asympo::learner
