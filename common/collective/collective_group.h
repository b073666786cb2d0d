// The c10d process groups the data-parallel learner (learner_server/
// parallel) and the weight group (weight_broadcaster/weight_group/weight_group.h) talk
// through, and the two backends that make one: Gloo (host memory; CPU
// ranks) and NCCL (device memory; one GPU a rank). Each backend is its own
// source file, compiled only where the LibTorch build and its headers have
// it (common/collective/CMakeLists.txt); a build without one gets
// collective_backends_missing.cc's refusal instead. This header brings only
// c10d's base class and no project header, so CMake can test that a
// backend's file compiles against the LibTorch it found.
#pragma once

#include <chrono>
#include <string>

#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace asympo::collective {

// What the backends derive from: c10d::ProcessGroup in LibTorch 1.x,
// c10d::Backend in 2.x (the collectives' signatures are the same).
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

// Whether this build has each backend.
bool GlooGroupBuilt();
bool NcclGroupBuilt();
// Why a backend is missing from this build, for the error that refuses it.
std::string GlooGroupMissing();
std::string NcclGroupMissing();

// Joins a world through `store` (every rank calls it). Throw c10d's
// exceptions (the caller reports them as a rank failure), or
// std::runtime_error with *Missing()'s text when the build lacks the
// backend.
//   Gloo: binds its transport to `local_addr` (a host name or address).
c10::intrusive_ptr<CollectiveGroup> NewGlooGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size,
                                                 std::chrono::milliseconds timeout,
                                                 const std::string& local_addr);
//   NCCL: each rank's tensors on its own GPU; the communicator is made at
//   the first collective. Waits block the host and throw after `timeout`
//   (TORCH_NCCL_BLOCKING_WAIT, unless the operator set it).
c10::intrusive_ptr<CollectiveGroup> NewNcclGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size,
                                                 std::chrono::milliseconds timeout);

}  // namespace asympo::collective
