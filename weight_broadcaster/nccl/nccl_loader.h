// Run-time binding to NCCL and the CUDA runtime (docs/architecture.md, "NCCL transport").
//
// Nothing in the project links libnccl or libcudart: LoadNccl() opens them
// with dlopen when the NCCL transport is first asked for, so every binary
// starts on machines without them and the transport can fall back to gRPC.
// The few types the calls need are declared in nccl_abi.h.
//
// Thread-safe. A successfully loaded API lives, and its libraries stay
// loaded, until the process exits (unloading the CUDA runtime under a live
// context is unsafe).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "weight_broadcaster/nccl/nccl_abi.h"

namespace asympo::broadcast {

// Function pointers into the loaded libraries. Members carry the C names of
// the functions they point to, so that call sites read like NCCL code.
struct NcclApi {
  // The files actually opened (as given to dlopen) and ncclGetVersion's code.
  std::string nccl_library;
  std::string cudart_library;
  int nccl_version = 0;
  int cudart_version = 0;  // cudaRuntimeGetVersion, e.g. 12040

  // NCCL.
  nccl::Result (*ncclGetVersion)(int* version) = nullptr;
  nccl::Result (*ncclGetUniqueId)(nccl::UniqueId* id) = nullptr;
  nccl::Result (*ncclCommInitRank)(nccl::Comm* comm, int nranks, nccl::UniqueId id,
                                   int rank) = nullptr;
  nccl::Result (*ncclBroadcast)(const void* sendbuff, void* recvbuff, size_t count,
                                nccl::DataType datatype, int root, nccl::Comm comm,
                                nccl::Stream stream) = nullptr;
  nccl::Result (*ncclCommAbort)(nccl::Comm comm) = nullptr;
  nccl::Result (*ncclCommDestroy)(nccl::Comm comm) = nullptr;
  nccl::Result (*ncclCommGetAsyncError)(nccl::Comm comm, nccl::Result* async_error) = nullptr;
  const char* (*ncclGetErrorString)(nccl::Result result) = nullptr;
  // Null when the library predates them (2.14 and 2.13 respectively).
  nccl::Result (*ncclCommInitRankConfig)(nccl::Comm* comm, int nranks, nccl::UniqueId id, int rank,
                                         nccl::Config* config) = nullptr;
  const char* (*ncclGetLastError)(nccl::Comm comm) = nullptr;

  // CUDA runtime.
  nccl::CudaError (*cudaGetDeviceCount)(int* count) = nullptr;
  nccl::CudaError (*cudaSetDevice)(int device) = nullptr;
  nccl::CudaError (*cudaRuntimeGetVersion)(int* version) = nullptr;
  nccl::CudaError (*cudaMalloc)(void** ptr, size_t size) = nullptr;
  nccl::CudaError (*cudaFree)(void* ptr) = nullptr;
  nccl::CudaError (*cudaMemcpy)(void* dst, const void* src, size_t count,
                                nccl::MemcpyKind kind) = nullptr;
  nccl::CudaError (*cudaMemcpyAsync)(void* dst, const void* src, size_t count,
                                     nccl::MemcpyKind kind, nccl::Stream stream) = nullptr;
  nccl::CudaError (*cudaStreamCreateWithFlags)(nccl::Stream* stream, unsigned int flags) = nullptr;
  nccl::CudaError (*cudaStreamQuery)(nccl::Stream stream) = nullptr;
  nccl::CudaError (*cudaStreamSynchronize)(nccl::Stream stream) = nullptr;
  nccl::CudaError (*cudaStreamDestroy)(nccl::Stream stream) = nullptr;
  nccl::CudaError (*cudaStreamWaitEvent)(nccl::Stream stream, nccl::Event event,
                                         unsigned int flags) = nullptr;
  nccl::CudaError (*cudaEventCreateWithFlags)(nccl::Event* event, unsigned int flags) = nullptr;
  nccl::CudaError (*cudaEventRecord)(nccl::Event event, nccl::Stream stream) = nullptr;
  nccl::CudaError (*cudaEventQuery)(nccl::Event event) = nullptr;
  nccl::CudaError (*cudaEventDestroy)(nccl::Event event) = nullptr;
  const char* (*cudaGetErrorString)(nccl::CudaError error) = nullptr;
  const char* (*cudaGetErrorName)(nccl::CudaError error) = nullptr;

  // Whether ncclCommInitRankConfig with blocking = 0 can be used.
  bool SupportsNonBlockingInit() const;
  // "ncclRemoteError (6): remote process exited or there was a network
  // error", plus ncclGetLastError(comm) when available and comm is not null.
  std::string NcclErrorText(nccl::Result result, nccl::Comm comm = nullptr) const;
  // "cudaErrorNoDevice (100): no CUDA-capable device is detected".
  std::string CudaErrorText(nccl::CudaError error) const;
};

// Where to find the libraries. An empty field means: the environment
// variable (ASYMPO_NCCL_LIBRARY, ASYMPO_CUDART_LIBRARY) if set, otherwise
// the loader's search path with the usual names (libnccl.so.2, libnccl.so;
// libcudart.so.13, .so.12, .so.11.0, libcudart.so).
struct NcclLoadOptions {
  std::string nccl_library;  // a path or a file name
  std::string cudart_library;
};

// Opens the CUDA runtime and NCCL and resolves every function above.
// Errors name the library:
// - UNAVAILABLE: no library found under the usual names (NCCL or CUDA is
//   not installed here; use the gRPC transport);
// - NOT_FOUND: a library named by an option or environment variable cannot
//   be opened (the message carries dlerror());
// - FAILED_PRECONDITION: a library was opened but lacks a required symbol
//   (not NCCL 2 / not a CUDA runtime) or reports an unusable version.
// Results are cached per distinct pair of names; failures are not cached.
absl::StatusOr<const NcclApi*> LoadNccl(const NcclLoadOptions& options = {});

// cudaGetDeviceCount. A machine without a driver or a device gives an error
// (for example cudaErrorNoDevice), never a crash.
absl::StatusOr<int> CudaDeviceCount(const NcclApi& api);

// True when the libraries load and at least one CUDA device is visible.
bool GpuAvailable(const NcclLoadOptions& options = {});

// "2.28.9" for 22809.
std::string NcclVersionString(int version_code);

}  // namespace asympo::broadcast
