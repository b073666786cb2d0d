// The NCCL backend of collective_group.h: c10d's ProcessGroupNCCL, compiled
// where LibTorch has CUDA, nccl.h is found and this file compiles against
// them (common/collective/CMakeLists.txt tests it), with USE_C10D_NCCL set as
// LibTorch's CUDA build was.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "common/collective/collective_group.h"

namespace asympo::collective {

bool NcclGroupBuilt() { return true; }
std::string NcclGroupMissing() { return ""; }

c10::intrusive_ptr<CollectiveGroup> NewNcclGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size,
                                                 std::chrono::milliseconds timeout) {
  // A collective's wait blocks the host and throws after the timeout, as
  // Gloo's does, so that a dead or hung rank ends the job with an error
  // naming the operation (and the step timings are the collectives').
  // ProcessGroupNCCL reads the variable when it is made; the older name
  // for LibTorch before 2.2. An operator's own setting wins.
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  setenv("NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace asympo::collective
