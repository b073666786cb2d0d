#include "common/model/activation_checkpoint.h"

#include <memory>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace asympo {
namespace {

using torch::autograd::variable_list;
using Fn = std::function<at::Tensor(const at::Tensor&)>;

// The backward node of one checkpointed call: its input is the call's
// output gradient; its next edges are x's and, without a residency, the
// parameters'.
class CheckpointBackward : public torch::autograd::Node {
 public:
  // input: the call's argument, detached; input_grad: whether it needs a
  // gradient.
  CheckpointBackward(Fn fn, at::Tensor input, bool input_grad, variable_list params,
                     std::shared_ptr<const CallResidency> residency)
      : fn_(std::move(fn)),
        input_(std::move(input)),
        input_grad_(input_grad),
        params_(std::move(params)),
        residency_(std::move(residency)) {}

  variable_list apply(variable_list&& grads) override {
    const size_t edges = residency_ ? 1 : 1 + params_.size();
    variable_list out(edges);
    if (!grads[0].defined()) return out;
    if (residency_) residency_->gather();
    // Reentrant: a graph of its own for the call, differentiated at once.
    variable_list g;
    {
      at::AutoGradMode grad_on(true);
      const at::Tensor x = input_.detach().requires_grad_(input_grad_);
      const at::Tensor y = fn_(x);
      variable_list inputs;
      if (input_grad_) inputs.push_back(x);
      for (const at::Tensor& p : params_) {
        if (p.defined() && p.requires_grad()) inputs.push_back(p);
      }
      g = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
    }
    size_t k = 0;
    if (input_grad_) out[0] = g[k++];
    variable_list param_grads(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].defined() && params_[i].requires_grad()) param_grads[i] = g[k++];
    }
    if (residency_) {
      residency_->release();
      residency_->reduce(param_grads);
    } else {
      for (size_t i = 0; i < params_.size(); ++i) out[1 + i] = param_grads[i];
    }
    return out;
  }

  void release_variables() override {
    input_.reset();
    fn_ = nullptr;
  }

 private:
  Fn fn_;
  at::Tensor input_;
  bool input_grad_;
  variable_list params_;
  std::shared_ptr<const CallResidency> residency_;
};

// fn(x) without recording a graph, between gather() and release().
at::Tensor RunWithoutGraph(const Fn& fn, const at::Tensor& x, const CallResidency* residency) {
  at::NoGradGuard no_grad;
  if (residency != nullptr) residency->gather();
  at::Tensor y = fn(x);
  if (residency != nullptr) residency->release();
  return y;
}

}  // namespace

at::Tensor CheckpointedCall(Fn fn, const at::Tensor& x, const std::vector<at::Tensor>& params,
                            std::shared_ptr<const CallResidency> residency) {
  // Without a residency, the parameters that need gradients are edges;
  // with one, every given parameter's gradient goes to reduce().
  variable_list kept;
  bool any_param = false;
  for (const at::Tensor& p : params) {
    const bool needed = p.defined() && p.requires_grad();
    if (needed || residency != nullptr) kept.push_back(p);
    any_param |= needed;
  }
  at::Tensor y = RunWithoutGraph(fn, x, residency.get());
  if (!at::GradMode::is_enabled() || (!x.requires_grad() && !any_param)) return y;
  torch::autograd::edge_list edges;
  edges.push_back(torch::autograd::impl::gradient_edge(x));
  if (residency == nullptr) {
    for (const at::Tensor& p : kept) edges.push_back(torch::autograd::impl::gradient_edge(p));
  }
  std::shared_ptr<CheckpointBackward> node(
      new CheckpointBackward(std::move(fn), x.detach(), x.requires_grad(), std::move(kept),
                             std::move(residency)),
      torch::autograd::deleteNode);
  node->set_next_edges(std::move(edges));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace asympo
