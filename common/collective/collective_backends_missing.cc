// The refusals of a backend this build lacks (collective_group.h): CMake
// compiles this file with ASYMPO_WITHOUT_GLOO_GROUP and/or
// ASYMPO_WITHOUT_NCCL_GROUP for the backends whose own files it left out.
#include <stdexcept>

#include "common/collective/collective_group.h"

namespace asympo::collective {

#ifdef ASYMPO_WITHOUT_GLOO_GROUP
bool GlooGroupBuilt() { return false; }
std::string GlooGroupMissing() {
  return "this asympo-learner was built without Gloo's headers (gloo/algorithm.h was not found "
         "beside its LibTorch), so it has no Gloo backend; see docs/operations.md, \"Several "
         "learner ranks\"";
}
c10::intrusive_ptr<CollectiveGroup> NewGlooGroup(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                 std::chrono::milliseconds, const std::string&) {
  throw std::runtime_error(GlooGroupMissing());
}
#endif

#ifdef ASYMPO_WITHOUT_NCCL_GROUP
bool NcclGroupBuilt() { return false; }
std::string NcclGroupMissing() {
  return "this asympo-learner was built without c10d's NCCL process group (it needs a LibTorch "
         "with CUDA, NCCL's nccl.h, and CMake's check that ProcessGroupNCCL compiles: see the "
         "configure log, and docs/operations.md, \"Several learner ranks\")";
}
c10::intrusive_ptr<CollectiveGroup> NewNcclGroup(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                 std::chrono::milliseconds) {
  throw std::runtime_error(NcclGroupMissing());
}
#endif

}  // namespace asympo::collective
