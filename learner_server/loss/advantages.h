// Group-relative advantages.
//
// A prompt's G responses form a group; each response's advantage is its
// reward minus the group's mean reward (docs/method.md), optionally
// divided by the group's standard deviation (the GRPO habit). Stateless and
// thread-safe.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"

namespace asympo::learner {

enum class AdvantageNormalization {
  // A_g = r_g - mean(r): the paper's plain mean baseline (default).
  kMean,
  // A_g = (r_g - mean(r)) / (std(r) + std_epsilon), std with Bessel's
  // correction (as torch.std), as in GRPO implementations.
  kMeanStd,
};

struct AdvantageOptions {
  AdvantageNormalization normalization = AdvantageNormalization::kMean;
  // Added to the group std under kMeanStd; a group whose rewards are all
  // equal gets advantages 0 / epsilon = 0.
  double std_epsilon = 1e-6;
};

// Parses "mean" or "mean_std".
absl::StatusOr<AdvantageNormalization> ParseAdvantageNormalization(std::string_view name);

// Group structure of a flat batch of responses.
struct GroupLayout {
  // (P,) float64: number of responses in each group.
  at::Tensor sizes;
  int64_t num_groups = 0;
};

// Checks that `group_index` (N,) int64 assigns each response to a group in
// [0, num_groups), that every group has at least 2 responses, and that
// `rewards` (N,) is floating and finite. Errors name the offending group or
// response. Returns the group sizes.
absl::StatusOr<GroupLayout> ValidateGroups(const at::Tensor& rewards, const at::Tensor& group_index,
                                           int64_t num_groups);

// Returns (N,) float64 advantages. The same checks as ValidateGroups.
absl::StatusOr<at::Tensor> ComputeGroupAdvantages(const at::Tensor& rewards,
                                                  const at::Tensor& group_index, int64_t num_groups,
                                                  const AdvantageOptions& options = {});

}  // namespace asympo::learner
