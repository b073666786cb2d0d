// Activation checkpointing: a differentiable call whose activations are not
// kept for the backward pass but computed again there.
//
// CheckpointedCall(fn, x, params) returns fn(x), computed without recording
// a graph; the backward runs fn on the saved input again, with gradients
// on, and differentiates that: the gradients of x and of params are the
// same as those of a plain call (bitwise on CPU in float32: the same
// kernels run on the same inputs). Memory between the forward and the
// backward: x and the output, instead of every intermediate of fn.
//
// fn must be deterministic (no dropout or sampling) and own whatever it
// reads besides its argument and params: it is kept until the backward.
// Thread-safe as far as fn is.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace asympo {

// Where the weights a call reads live when they are sharded (fully sharded
// data parallelism): gather() makes them whole before each run of fn (the
// forward, and the backward's again), release() frees them after it, and
// reduce() takes their gradients (one per param, undefined where fn did not
// use it) instead of accumulating them into the params' .grad.
struct CallResidency {
  std::function<void()> gather;
  std::function<void()> release;
  std::function<void(const std::vector<at::Tensor>& grads)> reduce;
};

// `params`: the tensors fn reads that need gradients (undefined entries are
// skipped, or with `residency`, given to reduce() as undefined gradients).
// Without gradient recording, fn(x) itself (between gather() and release()
// with `residency`).
at::Tensor CheckpointedCall(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& x,
                            const std::vector<at::Tensor>& params,
                            std::shared_ptr<const CallResidency> residency = nullptr);

}  // namespace asympo
