#include "learner_server/token_logprobs.h"

#include <algorithm>

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"

namespace asympo::learner {

absl::StatusOr<at::Tensor> TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets,
                                         const at::Tensor& mask) {
  if (!logits.defined() || logits.dim() != 3 || !at::isFloatingType(logits.scalar_type())) {
    return absl::InvalidArgumentError("logits must be a floating (N, T, V) tensor");
  }
  const int64_t n = logits.size(0), t = logits.size(1), v = logits.size(2);
  if (!targets.defined() || targets.sizes() != at::IntArrayRef({n, t})) {
    return absl::InvalidArgumentError(
        absl::StrCat("targets must have shape (", n, ", ", t, ") to match logits"));
  }
  if (targets.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError("targets must be int64");
  }
  if (!mask.defined() || mask.sizes() != at::IntArrayRef({n, t})) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask must have shape (", n, ", ", t, ") to match logits"));
  }
  const at::Tensor m = mask.to(at::kBool);
  // Padding may hold any id; gather needs valid ones.
  const at::Tensor ids = targets.masked_fill(m.logical_not(), 0);
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= v) {
      return absl::InvalidArgumentError(
          absl::StrCat("target id ", lo < 0 ? lo : hi, " is outside the vocabulary [0, ", v, ")"));
    }
  }
  // picked, lse: (N, T)
  const at::Tensor picked = logits.gather(2, ids.unsqueeze(2)).squeeze(2);
  const at::Tensor lse = at::logsumexp(logits, {2});
  return (picked - lse).masked_fill(m.logical_not(), 0.0);
}

PaddedSequences PadSequences(const std::vector<std::vector<int32_t>>& sequences, int64_t pad_id) {
  const int64_t n = static_cast<int64_t>(sequences.size());
  size_t longest = 1;
  for (const auto& s : sequences) longest = std::max(longest, s.size());
  const int64_t t = static_cast<int64_t>(longest);
  at::Tensor ids = at::full({n, t}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({n, t}, at::kBool);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<bool, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = sequences[static_cast<size_t>(i)];
    for (size_t j = 0; j < s.size(); ++j) {
      ids_a[i][static_cast<int64_t>(j)] = s[j];
      mask_a[i][static_cast<int64_t>(j)] = true;
    }
  }
  return {ids, mask};
}

}  // namespace asympo::learner
