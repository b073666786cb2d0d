#include "learner_server/loss/advantages.h"

#include <limits>
#include <string>

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo::learner {

absl::StatusOr<AdvantageNormalization> ParseAdvantageNormalization(std::string_view name) {
  if (name == "mean") return AdvantageNormalization::kMean;
  if (name == "mean_std") return AdvantageNormalization::kMeanStd;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown advantage normalization \"", std::string(name), "\"; expected mean or mean_std"));
}

absl::StatusOr<GroupLayout> ValidateGroups(const at::Tensor& rewards, const at::Tensor& group_index,
                                           int64_t num_groups) {
  if (!rewards.defined() || rewards.dim() != 1) {
    return absl::InvalidArgumentError("rewards must be a 1-D tensor (N,)");
  }
  if (!at::isFloatingType(rewards.scalar_type())) {
    return absl::InvalidArgumentError("rewards must be a floating-point tensor");
  }
  const int64_t n = rewards.size(0);
  if (n == 0) return absl::InvalidArgumentError("batch has no responses");
  if (!group_index.defined() || group_index.dim() != 1 || group_index.size(0) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_index must be a 1-D tensor with one entry per response (", n, ")"));
  }
  if (group_index.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError("group_index must be int64");
  }
  if (num_groups <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_groups must be positive, got ", num_groups));
  }
  const at::Tensor finite = at::isfinite(rewards);
  if (!finite.all().item<bool>()) {
    const int64_t i = at::logical_not(finite).nonzero().min().item<int64_t>();
    return absl::InvalidArgumentError(absl::StrCat(
        "reward of response ", i, " is ", rewards[i].item<double>(), "; rewards must be finite"));
  }
  const at::Tensor gi = group_index.cpu();
  const int64_t lo = gi.min().item<int64_t>();
  const int64_t hi = gi.max().item<int64_t>();
  if (lo < 0 || hi >= num_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_index holds ", lo < 0 ? lo : hi, ", outside [0, ", num_groups, ")"));
  }
  const at::Tensor sizes = at::bincount(gi, {}, num_groups);
  const auto* s = sizes.data_ptr<int64_t>();
  for (int64_t g = 0; g < num_groups; ++g) {
    if (s[g] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", g, " is empty; every group needs at least 2 responses"));
    }
    if (s[g] == 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ", g, " has 1 response; an advantage needs a group of at least 2"));
    }
  }
  return GroupLayout{sizes.to(rewards.device(), at::kDouble), num_groups};
}

absl::StatusOr<at::Tensor> ComputeGroupAdvantages(const at::Tensor& rewards,
                                                  const at::Tensor& group_index, int64_t num_groups,
                                                  const AdvantageOptions& options) {
  ASYMPO_ASSIGN_OR_RETURN(GroupLayout layout, ValidateGroups(rewards, group_index, num_groups));
  if (options.normalization == AdvantageNormalization::kMeanStd && !(options.std_epsilon > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "std_epsilon must be positive with mean_std normalization, got ", options.std_epsilon));
  }
  // r, a: (N,) float64; group sums: (P,)
  const at::Tensor r = rewards.detach().to(at::kDouble);
  const at::Tensor gi = group_index.to(r.device());
  const at::Tensor mean = at::zeros({num_groups}, r.options()).index_add_(0, gi, r) / layout.sizes;
  at::Tensor a = r - mean.index_select(0, gi);
  if (options.normalization == AdvantageNormalization::kMeanStd) {
    const at::Tensor var =
        at::zeros({num_groups}, r.options()).index_add_(0, gi, a * a) / (layout.sizes - 1.0);
    a = a / (var.sqrt().index_select(0, gi) + options.std_epsilon);
  }
  // "All rewards equal" is decided from the rewards, not from the rounded
  // advantages: (0.7, 0.7, 0.7) has a float64 mean that is not 0.7, and its
  // advantages would be +-1e-16 instead of 0 (and the group not counted as
  // degenerate by gpg's alpha and the diagnostics).
  const at::Tensor high =
      at::full({num_groups}, -std::numeric_limits<double>::infinity(), r.options())
          .scatter_reduce(0, gi, r, "amax", /*include_self=*/true);
  const at::Tensor low =
      at::full({num_groups}, std::numeric_limits<double>::infinity(), r.options())
          .scatter_reduce(0, gi, r, "amin", /*include_self=*/true);
  return a.masked_fill((high == low).index_select(0, gi), 0.0);
}

}  // namespace asympo::learner
