#include "learner_server/loss/token_logprobs.h"

#include <algorithm>

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"

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
  return GuardTorch("token log-probs", [&]() -> absl::StatusOr<at::Tensor> {
    // picked, lse: (N, T)
    const at::Tensor picked = logits.gather(2, ids.unsqueeze(2)).squeeze(2);
    const at::Tensor lse = at::logsumexp(logits, {2});
    return (picked - lse).masked_fill(m.logical_not(), 0.0);
  });
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

#include <torch/csrc/autograd/custom_function.h>

namespace asympo::learner {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward saves nothing beyond its inputs; backward recomputes each chunk's
// logits. d logp_i / d logits_i = onehot(target_i) - softmax_i.
class ChunkedLogProbsFunction : public torch::autograd::Function<ChunkedLogProbsFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets, int64_t chunk) {
    const int64_t m = hidden.size(0);
    at::Tensor out = at::empty({m}, hidden.options().dtype(at::kFloat));
    // Mixed precision: the matmuls run in hidden's dtype (a float32 master
    // weight is cast once per call), the softmax in float32.
    const at::Tensor w = weight.to(hidden.scalar_type());
    for (int64_t start = 0; start < m; start += chunk) {
      const int64_t n = std::min(chunk, m - start);
      // logits: (n, V) float32
      // logits and their log_softmax: the two (n, V) buffers of the bound.
      const at::Tensor logits = at::linear(hidden.narrow(0, start, n), w).to(at::kFloat);
      const at::Tensor index = targets.narrow(0, start, n).unsqueeze(1);
      const at::Tensor picked = at::log_softmax(logits, 1).gather(1, index).squeeze(1);
      out.narrow(0, start, n).copy_(picked);
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor g = grad_outputs[0].to(at::kFloat);  // (M,)
    const int64_t m = hidden.size(0);
    const at::Tensor w = weight.to(hidden.scalar_type());
    const bool low_precision =
        hidden.scalar_type() == at::kBFloat16 || hidden.scalar_type() == at::kHalf;
    at::Tensor grad_hidden = at::zeros_like(hidden);
    // A frozen lm_head (low-rank adapters train the layers alone) needs no
    // (V, H) gradient: neither its buffer nor its GEMMs.
    const bool weight_grad = ctx->needs_input_grad(1);
    at::Tensor grad_weight =
        weight_grad ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t start = 0; start < m; start += chunk) {
      const int64_t n = std::min(chunk, m - start);
      const at::Tensor h = hidden.narrow(0, start, n);
      const at::Tensor gc = g.narrow(0, start, n).unsqueeze(1);  // (n, 1)
      // grad_logits = g * (onehot - softmax): the recomputed logits and their
      // softmax are the two (n, V) buffers of the bound.
      at::Tensor grad_logits = at::softmax(at::linear(h, w).to(at::kFloat), 1);
      grad_logits.mul_(-gc);
      grad_logits.scatter_add_(1, targets.narrow(0, start, n).unsqueeze(1), gc);
      const at::Tensor gl = grad_logits.to(hidden.scalar_type());
      grad_hidden.narrow(0, start, n).copy_(at::matmul(gl, w));
      if (!weight_grad) continue;
      // bf16 compute: the weight gradient's GEMM in bf16 too (float32
      // accumulation inside the GEMM), summed into a float32 buffer.
      if (low_precision) {
        grad_weight.add_(at::matmul(gl.t(), h));
      } else {
        grad_weight.addmm_(grad_logits.t(), h.to(at::kFloat));
      }
    }
    return {grad_hidden, weight_grad ? grad_weight.to(weight.scalar_type()) : at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

absl::StatusOr<at::Tensor> ChunkedTokenLogProbs(const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t chunk_rows) {
  if (!hidden.defined() || hidden.dim() != 2 || !at::isFloatingType(hidden.scalar_type())) {
    return absl::InvalidArgumentError("hidden must be a floating (M, H) tensor");
  }
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != hidden.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat("weight must be (V, ", hidden.size(1), ")"));
  }
  if (!targets.defined() || targets.dim() != 1 || targets.size(0) != hidden.size(0) ||
      targets.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(
        absl::StrCat("targets must be int64 (", hidden.size(0), ",) to match hidden"));
  }
  if (chunk_rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_rows must be positive, got ", chunk_rows));
  }
  if (targets.numel() > 0) {
    const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
    if (lo < 0 || hi >= weight.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target id ", lo < 0 ? lo : hi, " is outside the vocabulary [0, ", weight.size(0), ")"));
    }
  }
  return GuardTorch("chunked token log-probs", [&]() -> absl::StatusOr<at::Tensor> {
    return ChunkedLogProbsFunction::apply(hidden, weight, targets, chunk_rows);
  });
}

int64_t ChunkedLogProbsPeakBytes(int64_t rows, int64_t vocab, int64_t chunk_rows) {
  const int64_t c = std::min(rows, chunk_rows);
  return 2 * c * vocab * 4;
}

}  // namespace asympo::learner
