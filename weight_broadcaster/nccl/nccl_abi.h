// The slice of the NCCL 2.x and CUDA runtime C ABI that the NCCL transport
// calls, declared here so that nothing in the project needs nccl.h or the
// CUDA headers to build (docs/architecture.md, "NCCL transport"). The values are the ones NCCL
// and CUDA document and keep stable across releases; handles are opaque
// pointers, enums are C ints.
//
// Types and constants only: the functions are resolved at run time by
// nccl_loader.h. No dependencies, so that a test double of the libraries can
// include it too.
#pragma once

#include <climits>
#include <cstddef>

namespace asympo::broadcast::nccl {

// Opaque handles: ncclComm_t, cudaStream_t, cudaEvent_t.
struct CommHandle;
using Comm = CommHandle*;
struct StreamHandle;
using Stream = StreamHandle*;
struct EventHandle;
using Event = EventHandle*;

// ncclUniqueId: 128 opaque bytes, passed by value to ncclCommInitRank.
inline constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};

// ncclResult_t.
using Result = int;
inline constexpr Result kSuccess = 0;
inline constexpr Result kUnhandledCudaError = 1;
inline constexpr Result kSystemError = 2;
inline constexpr Result kInternalError = 3;
inline constexpr Result kInvalidArgument = 4;
inline constexpr Result kInvalidUsage = 5;
inline constexpr Result kRemoteError = 6;
// A non-blocking communicator has not finished the call yet: poll
// ncclCommGetAsyncError until it reports something else.
inline constexpr Result kInProgress = 7;

// ncclDataType_t. The transport moves bytes.
using DataType = int;
inline constexpr DataType kInt8 = 0;  // also ncclChar
inline constexpr DataType kUint8 = 1;

// ncclConfig_t as of NCCL 2.17 (the fields up to netName). Later releases
// append fields; NCCL reads only `size` bytes and fills fields newer than
// `version` with its defaults, so this prefix is accepted by every release
// that has ncclCommInitRankConfig (2.14 and later).
struct Config {
  size_t size = sizeof(Config);
  unsigned int magic = 0xcafebeef;
  unsigned int version = 21700;  // NCCL_VERSION(2, 17, 0)
  int blocking = INT_MIN;        // NCCL_CONFIG_UNDEF_INT: NCCL's default
  int cga_cluster_size = INT_MIN;
  int min_ctas = INT_MIN;
  int max_ctas = INT_MIN;
  const char* net_name = nullptr;
};

// ncclGetVersion's code: 2.8.4 -> 2804, from 2.9 on 2.28.9 -> 22809.
constexpr int VersionCode(int major, int minor, int patch) {
  return (major <= 2 && minor <= 8) ? major * 1000 + minor * 100 + patch
                                    : major * 10000 + minor * 100 + patch;
}
// The first release with ncclCommInitRankConfig (non-blocking init).
inline constexpr int kFirstConfigVersion = VersionCode(2, 14, 0);

// cudaError_t.
using CudaError = int;
inline constexpr CudaError kCudaSuccess = 0;
// cudaStreamQuery / cudaEventQuery: work is still pending.
inline constexpr CudaError kCudaErrorNotReady = 600;

// cudaMemcpyKind.
using MemcpyKind = int;
inline constexpr MemcpyKind kMemcpyHostToDevice = 1;
inline constexpr MemcpyKind kMemcpyDeviceToHost = 2;

// Flags: cudaStreamNonBlocking (no implicit sync with the legacy default
// stream), cudaEventDisableTiming (the cheapest event).
inline constexpr unsigned int kStreamNonBlocking = 0x01;
inline constexpr unsigned int kEventDisableTiming = 0x02;

}  // namespace asympo::broadcast::nccl
