#include "weight_broadcaster/nccl/nccl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace asympo::broadcast {
namespace {

constexpr char kNcclEnv[] = "ASYMPO_NCCL_LIBRARY";
constexpr char kCudartEnv[] = "ASYMPO_CUDART_LIBRARY";

// The library the user named (option first, then environment), or an empty
// name to search the usual ones. `source` says where the name came from.
struct Requested {
  std::string name;
  std::string source;
};

Requested Resolve(const std::string& option, const char* env) {
  if (!option.empty()) return {option, "NcclLoadOptions"};
  const char* value = std::getenv(env);
  if (value != nullptr && *value != '\0') return {value, env};
  return {};
}

std::string DlError() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown dlopen error";
}

struct Library {
  void* handle = nullptr;
  std::string name;
};

// Handles are never closed: a library that loaded stays mapped for the
// process (unloading CUDA under a live context is unsafe, and a library that
// failed symbol resolution costs only its mapping).
absl::StatusOr<Library> Open(absl::string_view what, const Requested& requested, const char* env,
                             const std::vector<std::string>& candidates) {
  if (!requested.name.empty()) {
    void* handle = dlopen(requested.name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::NotFoundError(absl::StrCat("cannot load the ", what, " library \"",
                                              requested.name, "\" (from ", requested.source,
                                              "): ", DlError()));
    }
    return Library{handle, requested.name};
  }
  std::string last_error;
  for (const std::string& candidate : candidates) {
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return Library{handle, candidate};
    last_error = DlError();
  }
  return absl::UnavailableError(absl::StrCat(what, " library not found (tried ",
                                             absl::StrJoin(candidates, ", "),
                                             "; last error: ", last_error, "). Install it, set ",
                                             env, " to its path, or use the gRPC transport"));
}

template <typename Fn>
absl::Status Bind(const Library& library, const char* symbol, absl::string_view expected, Fn* out,
                  bool required = true) {
  dlerror();
  void* address = dlsym(library.handle, symbol);
  if (address == nullptr) {
    *out = nullptr;
    if (!required) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("\"", library.name, "\" has no symbol ", symbol, " (is it ", expected, "?)"));
  }
  *out = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

absl::Status BindCudart(const Library& lib, NcclApi& api) {
  constexpr absl::string_view kWhat = "a CUDA runtime library";
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaGetDeviceCount", kWhat, &api.cudaGetDeviceCount));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaSetDevice", kWhat, &api.cudaSetDevice));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaRuntimeGetVersion", kWhat, &api.cudaRuntimeGetVersion));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaMalloc", kWhat, &api.cudaMalloc));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaFree", kWhat, &api.cudaFree));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaMemcpy", kWhat, &api.cudaMemcpy));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaMemcpyAsync", kWhat, &api.cudaMemcpyAsync));
  ASYMPO_RETURN_IF_ERROR(
      Bind(lib, "cudaStreamCreateWithFlags", kWhat, &api.cudaStreamCreateWithFlags));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaStreamQuery", kWhat, &api.cudaStreamQuery));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaStreamSynchronize", kWhat, &api.cudaStreamSynchronize));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaStreamDestroy", kWhat, &api.cudaStreamDestroy));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaStreamWaitEvent", kWhat, &api.cudaStreamWaitEvent));
  ASYMPO_RETURN_IF_ERROR(
      Bind(lib, "cudaEventCreateWithFlags", kWhat, &api.cudaEventCreateWithFlags));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaEventRecord", kWhat, &api.cudaEventRecord));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaEventQuery", kWhat, &api.cudaEventQuery));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaEventDestroy", kWhat, &api.cudaEventDestroy));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "cudaGetErrorString", kWhat, &api.cudaGetErrorString));
  ASYMPO_RETURN_IF_ERROR(
      Bind(lib, "cudaGetErrorName", kWhat, &api.cudaGetErrorName, /*required=*/false));
  return absl::OkStatus();
}

absl::Status BindNccl(const Library& lib, NcclApi& api) {
  constexpr absl::string_view kWhat = "an NCCL 2 library";
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclGetVersion", kWhat, &api.ncclGetVersion));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclGetUniqueId", kWhat, &api.ncclGetUniqueId));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclCommInitRank", kWhat, &api.ncclCommInitRank));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclBroadcast", kWhat, &api.ncclBroadcast));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclCommAbort", kWhat, &api.ncclCommAbort));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclCommDestroy", kWhat, &api.ncclCommDestroy));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclCommGetAsyncError", kWhat, &api.ncclCommGetAsyncError));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclGetErrorString", kWhat, &api.ncclGetErrorString));
  ASYMPO_RETURN_IF_ERROR(Bind(lib, "ncclCommInitRankConfig", kWhat, &api.ncclCommInitRankConfig,
                              /*required=*/false));
  ASYMPO_RETURN_IF_ERROR(
      Bind(lib, "ncclGetLastError", kWhat, &api.ncclGetLastError, /*required=*/false));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclApi>> LoadUncached(const Requested& nccl_name,
                                                      const Requested& cudart_name) {
  auto api = std::make_unique<NcclApi>();
  // The CUDA runtime first: the transport needs it for every copy, and
  // GpuAvailable() is meaningless without it.
  ASYMPO_ASSIGN_OR_RETURN(Library cudart, Open("CUDA runtime", cudart_name, kCudartEnv,
                                               {"libcudart.so.13", "libcudart.so.12",
                                                "libcudart.so.11.0", "libcudart.so"}));
  ASYMPO_RETURN_IF_ERROR(BindCudart(cudart, *api));
  api->cudart_library = cudart.name;
  if (api->cudaRuntimeGetVersion(&api->cudart_version) != nccl::kCudaSuccess) {
    api->cudart_version = 0;
  }

  ASYMPO_ASSIGN_OR_RETURN(Library nccl,
                          Open("NCCL", nccl_name, kNcclEnv, {"libnccl.so.2", "libnccl.so"}));
  ASYMPO_RETURN_IF_ERROR(BindNccl(nccl, *api));
  api->nccl_library = nccl.name;
  const nccl::Result result = api->ncclGetVersion(&api->nccl_version);
  if (result != nccl::kSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("ncclGetVersion failed in \"", nccl.name, "\": ", api->NcclErrorText(result)));
  }
  // ncclCommAbort and ncclCommGetAsyncError, which the watchdog needs,
  // appeared in 2.4.
  if (api->nccl_version < nccl::VersionCode(2, 4, 0)) {
    return absl::FailedPreconditionError(absl::StrCat("\"", nccl.name, "\" is NCCL ",
                                                      NcclVersionString(api->nccl_version),
                                                      "; the NCCL transport needs 2.4 or later"));
  }
  return api;
}

ABSL_CONST_INIT absl::Mutex cache_mu(absl::kConstInit);

std::map<std::pair<std::string, std::string>, const NcclApi*>& Cache()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu) {
  static auto* cache = new std::map<std::pair<std::string, std::string>, const NcclApi*>();
  return *cache;
}

}  // namespace

bool NcclApi::SupportsNonBlockingInit() const {
  return ncclCommInitRankConfig != nullptr && nccl_version >= nccl::kFirstConfigVersion;
}

std::string NcclApi::NcclErrorText(nccl::Result result, nccl::Comm comm) const {
  static constexpr const char* kNames[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  const char* name = (result >= 0 && result < 8) ? kNames[result] : "ncclResult";
  std::string text = absl::StrCat(name, " (", result, ")");
  if (ncclGetErrorString != nullptr) {
    const char* description = ncclGetErrorString(result);
    if (description != nullptr) absl::StrAppend(&text, ": ", description);
  }
  if (ncclGetLastError != nullptr && result != nccl::kSuccess) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') absl::StrAppend(&text, " [", last, "]");
  }
  return text;
}

std::string NcclApi::CudaErrorText(nccl::CudaError error) const {
  const char* name = cudaGetErrorName != nullptr ? cudaGetErrorName(error) : nullptr;
  const char* description = cudaGetErrorString != nullptr ? cudaGetErrorString(error) : nullptr;
  return absl::StrCat(name != nullptr ? name : "cudaError", " (", error, ")",
                      description != nullptr ? ": " : "",
                      description != nullptr ? description : "");
}

absl::StatusOr<const NcclApi*> LoadNccl(const NcclLoadOptions& options) {
  const Requested nccl_name = Resolve(options.nccl_library, kNcclEnv);
  const Requested cudart_name = Resolve(options.cudart_library, kCudartEnv);
  absl::MutexLock lock(&cache_mu);
  auto& cache = Cache();
  const auto key = std::make_pair(nccl_name.name, cudart_name.name);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<NcclApi> api, LoadUncached(nccl_name, cudart_name));
  const NcclApi* loaded = api.release();  // lives until exit, like the libraries
  cache.emplace(key, loaded);
  return loaded;
}

absl::StatusOr<int> CudaDeviceCount(const NcclApi& api) {
  int count = 0;
  const nccl::CudaError error = api.cudaGetDeviceCount(&count);
  if (error != nccl::kCudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ", api.CudaErrorText(error)));
  }
  return count;
}

bool GpuAvailable(const NcclLoadOptions& options) {
  absl::StatusOr<const NcclApi*> api = LoadNccl(options);
  if (!api.ok()) return false;
  absl::StatusOr<int> count = CudaDeviceCount(**api);
  return count.ok() && *count > 0;
}

std::string NcclVersionString(int code) {
  if (code >= 10000) {
    return absl::StrCat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
  }
  return absl::StrCat(code / 1000, ".", (code % 1000) / 100, ".", code % 100);
}

}  // namespace asympo::broadcast
