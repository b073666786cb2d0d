// decode_graph.h for a LibTorch without CUDA: the step runs eagerly.
#include "rollout_server/engine/decode_graph.h"

namespace asympo::rollout {

std::unique_ptr<DecodeGraph> CaptureDecodeGraph(const std::function<void()>& step,
                                                c10::Device device) {
  step();
  return nullptr;
}

bool DecodeGraphsCompiled() { return false; }

}  // namespace asympo::rollout
