// The decode step as a CUDA graph: one launch per generated token instead of
// hundreds of kernel launches, which dominate small-batch decoding on a GPU.
//
// Compiled in only where the LibTorch build has CUDA (CMake defines
// ASYMPO_WITH_CUDA; decode_graph_cuda.cc); elsewhere decode_graph_none.cc
// runs the step eagerly and returns null, and generation stays eager.
#pragma once

#include <functional>
#include <memory>

#include <c10/core/Device.h>

namespace asympo::rollout {

class DecodeGraph {
 public:
  virtual ~DecodeGraph() = default;
  // Launches the captured step on the current stream.
  virtual void Replay() = 0;
};

// Runs `step` once (a real step that also warms up the kernels), then
// captures it on a side stream of `device`. `step` must read and write only
// tensors that outlive the graph, in place, with no host synchronisation.
// Returns null, with the step still run once, where graphs are unavailable
// (not a CUDA device, a build without CUDA) or the capture failed (logged
// once per process).
std::unique_ptr<DecodeGraph> CaptureDecodeGraph(const std::function<void()>& step,
                                                c10::Device device);

// Whether this build can capture CUDA graphs at all.
bool DecodeGraphsCompiled();

}  // namespace asympo::rollout
