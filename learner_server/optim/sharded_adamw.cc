#include "learner_server/optim/sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo::learner {

ShardedAdamW::ShardedAdamW(std::vector<at::Tensor> params, AdamWOptions options,
                           ShardCollectives* collectives, int64_t bucket_elements)
    : params_(std::move(params)),
      options_(options),
      collectives_(collectives),
      has_state_(params_.size(), false) {
  for (const at::Tensor& p : params_) {
    offsets_.push_back(total_);
    total_ += p.numel();
  }
  const int64_t world = collectives_->world_size();
  chunk_ = std::max<int64_t>(1, (total_ + world - 1) / world);
  piece_ = std::max<int64_t>(1, std::min(chunk_, bucket_elements / world));
  const at::TensorOptions o =
      params_.empty() ? at::TensorOptions(at::kFloat) : params_[0].options();
  exp_avg_ = at::zeros({chunk_}, o);
  exp_avg_sq_ = at::zeros({chunk_}, o);
}

int64_t ShardedAdamW::Rounds() const { return (chunk_ + piece_ - 1) / piece_; }

int64_t ShardedAdamW::RoundLength(int64_t k) const {
  return std::min(chunk_, (k + 1) * piece_) - k * piece_;
}

int64_t ShardedAdamW::state_bytes() const {
  return 2 * chunk_ * static_cast<int64_t>(exp_avg_.element_size());
}

void ShardedAdamW::ReadFlat(const std::vector<at::Tensor>& tensors, int64_t begin,
                            at::Tensor out) const {
  const int64_t end = begin + out.numel();
  out.zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t lo = std::max(begin, offsets_[i]);
    const int64_t hi = std::min(end, offsets_[i] + params_[i].numel());
    if (lo >= hi || !tensors[i].defined()) continue;
    out.narrow(0, lo - begin, hi - lo)
        .copy_(tensors[i].reshape({-1}).narrow(0, lo - offsets_[i], hi - lo));
  }
}

void ShardedAdamW::WriteParams(int64_t begin, const at::Tensor& in) {
  const int64_t end = begin + in.numel();
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t lo = std::max(begin, offsets_[i]);
    const int64_t hi = std::min(end, offsets_[i] + params_[i].numel());
    if (lo >= hi) continue;
    params_[i]
        .view({-1})
        .narrow(0, lo - offsets_[i], hi - lo)
        .copy_(in.narrow(0, lo - begin, hi - lo));
  }
}

std::vector<at::Tensor> ShardedAdamW::Gradients() const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params_) out.push_back(p.grad());
  return out;
}

absl::StatusOr<double> ShardedAdamW::ReduceGradients() {
  at::NoGradGuard no_grad;
  const int world = collectives_->world_size();
  const std::vector<at::Tensor> grads = Gradients();
  grad_ = at::empty({chunk_}, exp_avg_.options());
  for (int64_t k = 0; k < Rounds(); ++k) {
    const int64_t n = RoundLength(k);
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back(at::empty({n}, exp_avg_.options()));
      ReadFlat(grads, r * chunk_ + RoundBegin(k), inputs.back());
    }
    at::Tensor out = grad_.narrow(0, RoundBegin(k), n);
    if (absl::Status s = collectives_->ReduceScatter(inputs, out); !s.ok()) {
      grad_.reset();
      return s;
    }
  }
  // Per parameter, as GradientNorm sums (the padding past the
  // last parameter is zero).
  std::vector<double> squares{0.0};
  const int64_t lo = collectives_->rank() * chunk_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t a = std::max(lo, offsets_[i]);
    const int64_t b = std::min(lo + chunk_, offsets_[i] + params_[i].numel());
    if (a < b) squares[0] += grad_.narrow(0, a - lo, b - a).pow(2).sum().item<double>();
  }
  if (absl::Status s = collectives_->SumValues(&squares); !s.ok()) {
    grad_.reset();
    return s;
  }
  // The summed gradient is in the chunk now.
  for (at::Tensor& p : params_) p.mutable_grad().reset();
  return std::sqrt(squares[0]);
}

void ShardedAdamW::DropGradients() { grad_.reset(); }

absl::Status ShardedAdamW::Apply(double lr, double scale, const std::vector<bool>& stepped) {
  at::NoGradGuard no_grad;
  const int world = collectives_->world_size();
  const int64_t lo = collectives_->rank() * chunk_;
  const int64_t hi = std::min(total_, lo + chunk_);
  if (scale != 1.0) grad_.mul_(scale);
  at::Tensor own = at::empty({chunk_}, exp_avg_.options());
  ReadFlat(params_, lo, own);
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!stepped[i]) continue;
    has_state_[i] = true;
    const int64_t a = std::max(lo, offsets_[i]);
    const int64_t b = std::min(hi, offsets_[i] + params_[i].numel());
    if (a >= b) continue;
    at::Tensor p = own.narrow(0, a - lo, b - a);
    at::Tensor m = exp_avg_.narrow(0, a - lo, b - a);
    at::Tensor v = exp_avg_sq_.narrow(0, a - lo, b - a);
    AdamWUpdate(p, grad_.narrow(0, a - lo, b - a), m, v, lr, step_, options_);
  }
  grad_.reset();
  for (int64_t k = 0; k < Rounds(); ++k) {
    const int64_t n = RoundLength(k);
    at::Tensor input = own.narrow(0, RoundBegin(k), n);
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(at::empty({n}, own.options()));
    ASYMPO_RETURN_IF_ERROR(collectives_->AllGather(input, outputs));
    for (int r = 0; r < world; ++r) WriteParams(r * chunk_ + RoundBegin(k), outputs[r]);
  }
  return absl::OkStatus();
}

std::vector<StatePiece> ShardedAdamW::MomentPieces() const {
  std::vector<int64_t> numels;
  std::vector<size_t> index;
  for (size_t i = 0; i < params_.size(); ++i)
    numels.push_back(params_[i].numel()), index.push_back(i);
  const int64_t first = collectives_->rank() * chunk_;
  std::vector<StatePiece> out =
      RunPieces(StateKind::kExpAvg, exp_avg_, first, offsets_, numels, index, has_state_);
  for (StatePiece& p :
       RunPieces(StateKind::kExpAvgSq, exp_avg_sq_, first, offsets_, numels, index, has_state_)) {
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<StatePiece> ShardedAdamW::PiecesToWrite(int rank, int world) const {
  std::vector<StatePiece> out = MomentPieces();
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back(WriterShare(StateKind::kWeight, i, params_[i], rank, world));
  }
  return out;
}

void ShardedAdamW::PrepareRestore(const std::vector<bool>& moments, int64_t steps) {
  for (size_t i = 0; i < has_state_.size(); ++i) has_state_[i] = i < moments.size() && moments[i];
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  step_ = steps;
}

std::vector<StatePiece> ShardedAdamW::PiecesToRead() {
  std::vector<StatePiece> out = MomentPieces();
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back(WriterShare(StateKind::kWeight, i, params_[i], 0, 1));  // every weight
  }
  return out;
}

absl::Status ShardedAdamW::ScatterState(const AdamW& full) {
  at::NoGradGuard no_grad;
  const int world = collectives_->world_size();
  const bool root = collectives_->rank() == 0;
  // Rank 0's step count and which parameters have state, to every rank.
  std::vector<double> header(1 + params_.size(), 0.0);
  if (root) {
    header[0] = static_cast<double>(full.step_count());
    for (size_t i = 0; i < params_.size(); ++i) header[1 + i] = full.exp_avg()[i].defined();
  }
  ASYMPO_RETURN_IF_ERROR(collectives_->SumValues(&header));
  step_ = static_cast<int64_t>(header[0]);
  for (size_t i = 0; i < params_.size(); ++i) has_state_[i] = header[1 + i] != 0;
  const std::vector<at::Tensor>* moments[] = {&full.exp_avg(), &full.exp_avg_sq()};
  at::Tensor* mine[] = {&exp_avg_, &exp_avg_sq_};
  for (int which = 0; which < 2; ++which) {
    // In host memory: rank 0's device holds one round of it at a time.
    at::Tensor flat;
    if (root) {
      flat = at::empty({world * chunk_}, exp_avg_.options().device(at::kCPU));
      ReadFlat(*moments[which], 0, flat);
    }
    for (int64_t k = 0; k < Rounds(); ++k) {
      const int64_t n = RoundLength(k);
      std::vector<at::Tensor> inputs;
      for (int r = 0; root && r < world; ++r) {
        inputs.push_back(flat.narrow(0, r * chunk_ + RoundBegin(k), n));
      }
      at::Tensor out = mine[which]->narrow(0, RoundBegin(k), n);
      ASYMPO_RETURN_IF_ERROR(collectives_->ScatterFromRank0(inputs, out));
    }
  }
  return absl::OkStatus();
}

}  // namespace asympo::learner
