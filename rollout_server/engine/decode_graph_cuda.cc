// decode_graph.h with CUDA (built only where LibTorch has CUDA;
// rollout_server/CMakeLists.txt). Untested on a machine without a GPU:
// deploy/gpu_check.sh runs the GPU generation tests that cover it.
#include <atomic>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <glog/logging.h>

#include "rollout_server/engine/decode_graph.h"

namespace asympo::rollout {
namespace {

class CudaDecodeGraph final : public DecodeGraph {
 public:
  void Replay() override { graph_.replay(); }
  at::cuda::CUDAGraph& graph() { return graph_; }

 private:
  at::cuda::CUDAGraph graph_;
};

}  // namespace

std::unique_ptr<DecodeGraph> CaptureDecodeGraph(const std::function<void()>& step,
                                                c10::Device device) {
  if (!device.is_cuda()) {
    step();
    return nullptr;
  }
  static std::atomic<bool> warned{false};
  c10::cuda::CUDAGuard device_guard(device);
  auto graph = std::make_unique<CudaDecodeGraph>();
  // Capture needs a side stream; the step's inputs were written on the
  // current stream, and its warm-up run must finish before capture.
  c10::cuda::device_synchronize();
  {
    c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, device.index()));
    step();
    c10::cuda::device_synchronize();
    try {
      // Thread-local capture: the weight receiver's copies into the spare
      // model on other threads go on while this thread captures.
      graph->graph().capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      step();
      graph->graph().capture_end();
    } catch (const std::exception& e) {
      if (!warned.exchange(true)) {
        LOG(WARNING) << "CUDA graph capture of the decode step failed; decoding eagerly: "
                     << e.what();
      }
      c10::cuda::device_synchronize();
      return nullptr;
    }
  }
  c10::cuda::device_synchronize();
  return graph;
}

bool DecodeGraphsCompiled() { return true; }

}  // namespace asympo::rollout
