// The Gloo backend of collective_group.h. ProcessGroupGloo.hpp declares its
// class only with USE_C10D_GLOO, which Debian's LibTorch and the CUDA
// wheels were built with (libtorch_cpu carries the symbols).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "common/collective/collective_group.h"

namespace asympo::collective {

bool GlooGroupBuilt() { return true; }
std::string GlooGroupMissing() { return ""; }

c10::intrusive_ptr<CollectiveGroup> NewGlooGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size,
                                                 std::chrono::milliseconds timeout,
                                                 const std::string& local_addr) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local_addr));
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace asympo::collective
