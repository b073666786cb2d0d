#include "learner_server/optim/full_shard.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo::learner {

FullShard::FullShard(PolicyModel* model, AdamWOptions options, ShardCollectives* collectives)
    : model_(model), options_(options), collectives_(collectives) {}

FullShard::~FullShard() { model_->set_layer_residency(nullptr); }

absl::StatusOr<std::unique_ptr<FullShard>> FullShard::Create(PolicyModel* model,
                                                             AdamWOptions options,
                                                             ShardCollectives* collectives,
                                                             const AdamW& state) {
  at::NoGradGuard no_grad;
  std::unique_ptr<FullShard> shard(new FullShard(model, options, collectives));
  const std::vector<at::Tensor> all = model->parameters();
  std::unordered_map<const void*, size_t> position;
  for (size_t i = 0; i < all.size(); ++i) position[all[i].unsafeGetTensorImpl()] = i;
  const int64_t layers = model->config().num_hidden_layers;
  std::vector<Unit>& units = shard->units_;
  units.resize(static_cast<size_t>(layers) + 1);
  std::vector<bool> in_layer(all.size(), false);
  for (int64_t l = 0; l < layers; ++l) {
    for (const at::Tensor& p : model->LayerParameters(l)) {
      const size_t i = position.at(p.unsafeGetTensorImpl());
      units[static_cast<size_t>(l) + 1].params.push_back(p);
      units[static_cast<size_t>(l) + 1].index.push_back(i);
      in_layer[i] = true;
    }
  }
  for (size_t i = 0; i < all.size(); ++i) {
    if (in_layer[i]) continue;
    units[0].params.push_back(all[i]);
    units[0].index.push_back(i);
  }
  const int world = collectives->world_size();
  const int64_t rank = collectives->rank();
  for (Unit& u : units) {
    for (const at::Tensor& p : u.params) {
      u.offsets.push_back(u.total);
      u.shapes.push_back(p.sizes().vec());
      u.numels.push_back(p.numel());
      u.total += p.numel();
    }
    u.chunk = std::max<int64_t>(1, (u.total + world - 1) / world);
    u.weight = shard->Flatten(u, u.params).narrow(0, rank * u.chunk, u.chunk).clone();
    u.exp_avg = at::zeros_like(u.weight);
    u.exp_avg_sq = at::zeros_like(u.weight);
  }
  for (size_t u = 0; u < units.size(); ++u) shard->ReleaseUnit(u);
  shard->local_grad_.assign(all.size(), false);
  shard->has_state_.assign(all.size(), false);
  ASYMPO_RETURN_IF_ERROR(shard->ScatterState(state));
  model->set_layer_residency(shard.get());
  return shard;
}

bool FullShard::Ok(const absl::Status& s) {
  if (!s.ok() && failed_.ok()) failed_ = s;
  return failed_.ok();
}

at::Tensor FullShard::Flatten(const Unit& unit, const std::vector<at::Tensor>& tensors) const {
  at::NoGradGuard no_grad;
  // A unit may be empty (the root with adapters: every parameter is a
  // layer's); it is then padding alone.
  const at::TensorOptions o =
      unit.weight.defined() ? unit.weight.options()
      : unit.params.empty() ? at::TensorOptions().dtype(at::kFloat).device(model_->options().device)
                            : unit.params.front().options();
  at::Tensor flat = at::zeros({collectives_->world_size() * unit.chunk}, o);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined() || tensors[i].numel() == 0) continue;
    flat.narrow(0, unit.offsets[i], tensors[i].numel()).copy_(tensors[i].reshape({-1}));
  }
  return flat;
}

std::vector<at::Tensor> FullShard::Pieces(const Unit& unit, const at::Tensor& flat) const {
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < collectives_->world_size(); ++r) {
    pieces.push_back(flat.narrow(0, r * unit.chunk, unit.chunk));
  }
  return pieces;
}

absl::StatusOr<at::Tensor> FullShard::GatherOnRank0(const Unit& unit, const at::Tensor& chunk) {
  at::Tensor whole;
  std::vector<at::Tensor> outputs;
  if (collectives_->rank() == 0) {
    whole = at::empty({collectives_->world_size() * unit.chunk}, unit.weight.options());
    outputs = Pieces(unit, whole);
  }
  at::Tensor input = chunk;
  ASYMPO_RETURN_IF_ERROR(collectives_->GatherToRank0(input, outputs));
  return whole;
}

void FullShard::Attach(Unit& unit, at::Tensor whole) {
  unit.whole = std::move(whole);
  for (size_t i = 0; i < unit.params.size(); ++i) {
    unit.params[i].set_data(
        unit.whole.narrow(0, unit.offsets[i], unit.numels[i]).view(unit.shapes[i]));
  }
}

void FullShard::GatherUnit(size_t u) {
  Unit& unit = units_[u];
  if (!failed_.ok() || unit.whole.defined()) return;
  at::NoGradGuard no_grad;
  at::Tensor whole = at::empty({collectives_->world_size() * unit.chunk}, unit.weight.options());
  std::vector<at::Tensor> outputs = Pieces(unit, whole);
  if (!Ok(collectives_->AllGather(unit.weight, outputs))) return;
  Attach(unit, std::move(whole));
}

void FullShard::ReleaseUnit(size_t u) {
  Unit& unit = units_[u];
  for (at::Tensor& p : unit.params) p.set_data(at::empty({0}, unit.weight.options()));
  unit.whole.reset();
}

void FullShard::ReduceScatterInto(Unit& unit, const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> inputs = Pieces(unit, flat);
  at::Tensor out = at::empty({unit.chunk}, unit.weight.options());
  if (!Ok(collectives_->ReduceScatter(inputs, out))) return;
  if (unit.grad.defined()) {
    unit.grad.add_(out);
  } else {
    unit.grad = std::move(out);
  }
}

void FullShard::ReduceGradients(int64_t layer, const std::vector<at::Tensor>& grads) {
  Unit& unit = units_[static_cast<size_t>(layer) + 1];
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) local_grad_[unit.index[i]] = true;
  }
  if (!failed_.ok()) return;
  ReduceScatterInto(unit, Flatten(unit, grads));
}

absl::Status FullShard::BeginStep() {
  failed_ = absl::OkStatus();
  for (Unit& u : units_) u.grad.reset();
  std::fill(local_grad_.begin(), local_grad_.end(), false);
  ReleaseUnit(0);  // a failed step's, maybe
  GatherUnit(0);
  return failed_;
}

absl::StatusOr<int64_t> FullShard::MostMicroBatches(int64_t mine) {
  std::vector<double> counts(static_cast<size_t>(collectives_->world_size()), 0.0);
  counts[static_cast<size_t>(collectives_->rank())] = static_cast<double>(mine);
  ASYMPO_RETURN_IF_ERROR(collectives_->SumValues(&counts));
  return static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
}

std::vector<bool> FullShard::LocalGradients(const std::vector<at::Tensor>& params) const {
  std::vector<bool> out = local_grad_;
  for (const size_t i : units_[0].index) out[i] = params[i].grad().defined();
  return out;
}

absl::StatusOr<double> FullShard::ReduceGradients() {
  at::NoGradGuard no_grad;
  Unit& root = units_[0];
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : root.params) grads.push_back(p.grad());
  if (failed_.ok()) ReduceScatterInto(root, Flatten(root, grads));
  for (at::Tensor& p : root.params) p.mutable_grad().reset();
  ReleaseUnit(0);
  if (!failed_.ok()) return failed_;
  // The padding past each unit's end is zero.
  std::vector<double> squares{0.0};
  for (const Unit& u : units_) {
    if (u.grad.defined()) squares[0] += u.grad.pow(2).sum().item<double>();
  }
  ASYMPO_RETURN_IF_ERROR(collectives_->SumValues(&squares));
  return std::sqrt(squares[0]);
}

void FullShard::DropGradients() {
  for (Unit& u : units_) u.grad.reset();
  for (at::Tensor& p : units_[0].params) p.mutable_grad().reset();
  ReleaseUnit(0);
}

absl::Status FullShard::Apply(double lr, double scale, const std::vector<bool>& stepped) {
  at::NoGradGuard no_grad;
  const int64_t rank = collectives_->rank();
  ++step_;
  for (Unit& u : units_) {
    const int64_t lo = rank * u.chunk;
    if (!u.grad.defined()) u.grad = at::zeros_like(u.weight);  // no rank had a gradient
    if (scale != 1.0) u.grad.mul_(scale);
    for (size_t i = 0; i < u.params.size(); ++i) {
      const size_t gi = u.index[i];
      if (!stepped[gi]) continue;
      has_state_[gi] = true;
      const int64_t a = std::max(lo, u.offsets[i]);
      const int64_t b = std::min(lo + u.chunk, u.offsets[i] + u.numels[i]);
      if (a >= b) continue;
      at::Tensor p = u.weight.narrow(0, a - lo, b - a);
      at::Tensor m = u.exp_avg.narrow(0, a - lo, b - a);
      at::Tensor v = u.exp_avg_sq.narrow(0, a - lo, b - a);
      AdamWUpdate(p, u.grad.narrow(0, a - lo, b - a), m, v, lr, step_, options_);
    }
    u.grad.reset();  // held during a step only
  }
  return absl::OkStatus();
}

absl::Status FullShard::GatherWeights() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < units_.size(); ++i) {
    ReleaseUnit(i);
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor whole, GatherOnRank0(units_[i], units_[i].weight));
    if (whole.defined()) Attach(units_[i], std::move(whole));
  }
  return absl::OkStatus();
}

absl::Status FullShard::VisitUnits(
    const std::function<absl::Status(const std::vector<size_t>&)>& fn) {
  at::NoGradGuard no_grad;
  absl::Status first;
  for (size_t i = 0; i < units_.size(); ++i) {
    ReleaseUnit(i);
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor whole, GatherOnRank0(units_[i], units_[i].weight));
    if (!whole.defined()) continue;  // not rank 0
    Attach(units_[i], std::move(whole));
    if (first.ok() && fn) first = fn(units_[i].index);
    ReleaseUnit(i);
  }
  return first;
}

void FullShard::ReleaseWeights() {
  for (size_t i = 0; i < units_.size(); ++i) ReleaseUnit(i);
}

std::vector<StatePiece> FullShard::Pieces() const {
  std::vector<StatePiece> out;
  const std::vector<bool> all(has_state_.size(), true);
  for (const Unit& u : units_) {
    const int64_t first = collectives_->rank() * u.chunk;
    const StateKind kinds[] = {StateKind::kWeight, StateKind::kExpAvg, StateKind::kExpAvgSq};
    const at::Tensor* data[] = {&u.weight, &u.exp_avg, &u.exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      for (StatePiece& p : RunPieces(kinds[k], *data[k], first, u.offsets, u.numels, u.index,
                                     k == 0 ? all : has_state_)) {
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> FullShard::ParamShapes() const {
  std::vector<std::vector<int64_t>> out(has_state_.size());
  for (const Unit& u : units_) {
    for (size_t i = 0; i < u.index.size(); ++i) out[u.index[i]] = u.shapes[i];
  }
  return out;
}

void FullShard::PrepareRestore(const std::vector<bool>& moments, int64_t steps) {
  for (size_t i = 0; i < has_state_.size(); ++i) has_state_[i] = i < moments.size() && moments[i];
  for (Unit& u : units_) {
    u.exp_avg.zero_();
    u.exp_avg_sq.zero_();
  }
  step_ = steps;
}

absl::Status FullShard::ScatterState(const AdamW& state) {
  at::NoGradGuard no_grad;
  const bool root = collectives_->rank() == 0;
  // Rank 0's step count and which parameters have state, to every rank.
  std::vector<double> header(1 + has_state_.size(), 0.0);
  if (root) {
    header[0] = static_cast<double>(state.step_count());
    for (size_t i = 0; i < has_state_.size(); ++i) header[1 + i] = state.exp_avg()[i].defined();
  }
  ASYMPO_RETURN_IF_ERROR(collectives_->SumValues(&header));
  step_ = static_cast<int64_t>(header[0]);
  for (size_t i = 0; i < has_state_.size(); ++i) has_state_[i] = header[1 + i] != 0;
  for (int which = 0; which < 2; ++which) {
    const std::vector<at::Tensor>& moments = which == 0 ? state.exp_avg() : state.exp_avg_sq();
    for (Unit& u : units_) {
      std::vector<at::Tensor> inputs;
      if (root) {
        std::vector<at::Tensor> mine;
        for (const size_t i : u.index) mine.push_back(moments[i]);
        inputs = Pieces(u, Flatten(u, mine));
      }
      at::Tensor out = which == 0 ? u.exp_avg : u.exp_avg_sq;
      ASYMPO_RETURN_IF_ERROR(collectives_->ScatterFromRank0(inputs, out));
    }
  }
  return absl::OkStatus();
}

int64_t FullShard::state_bytes() const {
  int64_t bytes = 0;
  for (const Unit& u : units_) bytes += 2 * u.chunk * static_cast<int64_t>(u.weight.element_size());
  return bytes;
}

int64_t FullShard::weight_bytes() const {
  int64_t bytes = 0;
  for (const Unit& u : units_) bytes += u.chunk * static_cast<int64_t>(u.weight.element_size());
  return bytes;
}

int64_t FullShard::largest_unit() const {
  int64_t most = 0;
  for (const Unit& u : units_) most = std::max(most, u.total);
  return most;
}

}  // namespace asympo::learner
