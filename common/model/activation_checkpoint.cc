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

// The backward node of one checkpointed call: its inputs are the call's
// output gradient, its next edges x's and the parameters'.
class CheckpointBackward : public torch::autograd::Node {
 public:
  // input: the call's argument, detached; input_grad: whether it needs a
  // gradient.
  CheckpointBackward(std::function<at::Tensor(const at::Tensor&)> fn, at::Tensor input,
                     bool input_grad, variable_list params)
      : fn_(std::move(fn)),
        input_(std::move(input)),
        input_grad_(input_grad),
        params_(std::move(params)) {}

  variable_list apply(variable_list&& grads) override {
    variable_list out(1 + params_.size());
    if (!grads[0].defined()) return out;
    // Reentrant: a graph of its own for the call, differentiated at once.
    at::AutoGradMode grad_on(true);
    const at::Tensor x = input_.detach().requires_grad_(input_grad_);
    const at::Tensor y = fn_(x);
    variable_list inputs;
    if (input_grad_) inputs.push_back(x);
    for (const at::Tensor& p : params_) inputs.push_back(p);
    const variable_list g = torch::autograd::grad({y}, inputs, {grads[0]},
                                                  /*retain_graph=*/false, /*create_graph=*/false,
                                                  /*allow_unused=*/true);
    size_t k = 0;
    if (input_grad_) out[0] = g[k++];
    for (size_t i = 0; i < params_.size(); ++i) out[1 + i] = g[k++];
    return out;
  }

  void release_variables() override {
    input_.reset();
    fn_ = nullptr;
  }

 private:
  std::function<at::Tensor(const at::Tensor&)> fn_;
  at::Tensor input_;
  bool input_grad_;
  variable_list params_;
};

}  // namespace

at::Tensor CheckpointedCall(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& x,
                            const std::vector<at::Tensor>& params) {
  variable_list needed;
  for (const at::Tensor& p : params) {
    if (p.defined() && p.requires_grad()) needed.push_back(p);
  }
  if (!at::GradMode::is_enabled() || (!x.requires_grad() && needed.empty())) return fn(x);
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = fn(x);
  }
  torch::autograd::edge_list edges;
  edges.push_back(torch::autograd::impl::gradient_edge(x));
  for (const at::Tensor& p : needed) edges.push_back(torch::autograd::impl::gradient_edge(p));
  std::shared_ptr<CheckpointBackward> node(
      new CheckpointBackward(std::move(fn), x.detach(), x.requires_grad(), needed),
      torch::autograd::deleteNode);
  node->set_next_edges(std::move(edges));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace asympo
