#include "learner_server/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"

namespace asympo::learner {

absl::Status ValidateAdamWOptions(const AdamWOptions& o) {
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("beta1 is ", o.beta1, "; it must be in [0, 1)"));
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("beta2 is ", o.beta2, "; it must be in [0, 1)"));
  }
  if (!(o.eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("eps is ", o.eps, "; it must be positive"));
  }
  if (!(o.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay is ", o.weight_decay, "; it must be >= 0"));
  }
  return absl::OkStatus();
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options)
    : params_(std::move(params)),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()),
      options_(options) {}

void AdamWUpdate(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr,
                 int64_t step, const AdamWOptions& options) {
  const double b1 = options.beta1, b2 = options.beta2;
  const double bias1 = 1 - std::pow(b1, static_cast<double>(step));
  const double bias2_sqrt = std::sqrt(1 - std::pow(b2, static_cast<double>(step)));
  if (options.weight_decay != 0) p.mul_(1 - lr * options.weight_decay);
  m.mul_(b1).add_(g, 1 - b1);
  v.mul_(b2).addcmul_(g, g, 1 - b2);
  const at::Tensor denom = (v.sqrt() / bias2_sqrt).add_(options.eps);
  p.addcdiv_(m, denom, -lr / bias1);
}

void AdamW::Step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
      exp_avg_sq_[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    AdamWUpdate(p, g, exp_avg_[i], exp_avg_sq_[i], lr, step_, options_);
  }
}

double GradientNorm(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> squares;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) squares.push_back(p.grad().pow(2).sum().to(at::kDouble));
  }
  return squares.empty() ? 0.0 : std::sqrt(at::stack(squares).sum().item<double>());
}

absl::Status AdamW::Apply(double lr, double scale, const std::vector<bool>& /*stepped*/) {
  if (scale != 1.0) {
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params_) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  Step(lr);
  ZeroGrad();
  return absl::OkStatus();
}

std::vector<bool> Optimizer::LocalGradients(const std::vector<at::Tensor>& params) const {
  std::vector<bool> out;
  for (const at::Tensor& p : params) out.push_back(p.grad().defined());
  return out;
}

void AdamW::ZeroGrad() {
  for (at::Tensor& p : params_) p.mutable_grad().reset();
}

std::vector<std::vector<int64_t>> ShapesOf(const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<int64_t>> out;
  for (const at::Tensor& t : tensors) out.push_back(t.sizes().vec());
  return out;
}

std::vector<std::vector<int64_t>> AdamW::ParamShapes() const { return ShapesOf(params_); }

StatePiece WriterShare(StateKind kind, size_t param, const at::Tensor& whole, int rank, int world) {
  const int64_t n = whole.numel();
  const int64_t chunk = (n + world - 1) / world;
  const int64_t begin = std::min(n, chunk * rank);
  const int64_t end = std::min(n, begin + chunk);
  return {kind, param, begin, whole.detach().view({-1}).narrow(0, begin, end - begin)};
}

std::vector<StatePiece> RunPieces(StateKind kind, const at::Tensor& chunk, int64_t first,
                                  const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& numels,
                                  const std::vector<size_t>& index, const std::vector<bool>& keep) {
  std::vector<StatePiece> out;
  const int64_t last = first + chunk.numel();
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (!keep[index[i]]) continue;
    const int64_t from = std::max(first, offsets[i]);
    const int64_t to = std::min(last, offsets[i] + numels[i]);
    if (from >= to) continue;
    out.push_back({kind, index[i], from - offsets[i], chunk.narrow(0, from - first, to - from)});
  }
  return out;
}

std::vector<StatePiece> AdamW::PiecesToWrite(int rank, int world) const {
  std::vector<StatePiece> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back(WriterShare(StateKind::kWeight, i, params_[i], rank, world));
    if (!exp_avg_[i].defined()) continue;
    out.push_back(WriterShare(StateKind::kExpAvg, i, exp_avg_[i], rank, world));
    out.push_back(WriterShare(StateKind::kExpAvgSq, i, exp_avg_sq_[i], rank, world));
  }
  return out;
}

std::vector<bool> AdamW::MomentsDefined() const {
  std::vector<bool> out;
  for (const at::Tensor& m : exp_avg_) out.push_back(m.defined());
  return out;
}

void AdamW::PrepareRestore(const std::vector<bool>& moments, int64_t steps) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool has = i < moments.size() && moments[i];
    exp_avg_[i] = has ? at::zeros_like(params_[i]) : at::Tensor();
    exp_avg_sq_[i] = has ? at::zeros_like(params_[i]) : at::Tensor();
  }
  step_ = steps;
}

std::vector<StatePiece> AdamW::PiecesToRead() {
  // Every piece is the whole of its tensor: a writer share of one rank.
  return PiecesToWrite(0, 1);
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto* moments : {&exp_avg_, &exp_avg_sq_}) {
    for (const at::Tensor& t : *moments) {
      if (t.defined()) bytes += t.nbytes();
    }
  }
  return bytes;
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::StateTensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    out.emplace_back(absl::StrCat("exp_avg.", i), exp_avg_[i]);
    out.emplace_back(absl::StrCat("exp_avg_sq.", i), exp_avg_sq_[i]);
  }
  return out;
}

absl::Status AdamW::LoadState(const std::vector<std::pair<std::string, at::Tensor>>& state,
                              int64_t step_count) {
  std::vector<at::Tensor> avg(params_.size()), sq(params_.size());
  for (const auto& [name, t] : state) {
    const bool is_avg = name.rfind("exp_avg.", 0) == 0;
    const bool is_sq = name.rfind("exp_avg_sq.", 0) == 0;
    const std::string index = name.substr(name.find('.') + 1);
    char* end = nullptr;
    const long i = std::strtol(index.c_str(), &end, 10);
    if ((!is_avg && !is_sq) || end == index.c_str() || *end != '\0' || i < 0 ||
        static_cast<size_t>(i) >= params_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state entry \"", name, "\" is not one of this optimizer's"));
    }
    if (t.sizes() != params_[i].sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state entry \"", name, "\" has the wrong shape"));
    }
    (is_avg ? avg : sq)[i] = t.to(params_[i].options()).clone();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (avg[i].defined() != sq[i].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state for parameter ", i, " has one moment but not the other"));
    }
  }
  exp_avg_ = std::move(avg);
  exp_avg_sq_ = std::move(sq);
  step_ = step_count;
  return absl::OkStatus();
}

}  // namespace asympo::learner
