#include "common/model/device.h"

#include <dlfcn.h>

#include <cstdlib>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace asympo {

int SetCpuThreads(int threads) {
  at::set_num_threads(threads);
  // Looked up, not linked: LibTorch may come with another BLAS (MKL, or
  // OpenBLAS built with OpenMP, which set_num_threads already caps).
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set == nullptr || get == nullptr) return 0;
  set(threads);
  return get();
}

int CudaDeviceCount() {
  if (!at::hasCUDA()) return 0;
  return static_cast<int>(at::getNumGPUs());
}

absl::StatusOr<c10::Device> ParseDevice(const std::string& value) {
  if (value == "cpu") return c10::Device(c10::kCPU);
  int index = 0;
  if (value != "cuda") {
    const std::string prefix = "cuda:";
    if (value.rfind(prefix, 0) != 0 || value.size() == prefix.size() ||
        value.find_first_not_of("0123456789", prefix.size()) != std::string::npos ||
        !absl::SimpleAtoi(value.substr(prefix.size()), &index) || index > 1023) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: \"", value, "\" is not a device; expected cpu, cuda or cuda:N"));
    }
  }
  if (!at::hasCUDA()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device: \"", value,
                     "\": this build's LibTorch has no CUDA support, or the CUDA driver is "
                     "missing; use cpu, or build against a CUDA LibTorch (deploy/gpu_check.sh)"));
  }
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device: \"", value, "\": no CUDA device is visible (CUDA_VISIBLE_DEVICES=",
        std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "<unset>",
        ")"));
  }
  if (index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device: \"", value, "\": only ", count,
                     " CUDA device(s) are visible (cuda:0..cuda:", count - 1, ")"));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

absl::StatusOr<c10::ScalarType> ParseComputeDType(const std::string& value,
                                                  const c10::Device& device) {
  if (value == "auto") return device.is_cuda() ? c10::kBFloat16 : c10::kFloat;
  if (value == "float32") return c10::kFloat;
  if (value == "bfloat16") return c10::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("--compute_dtype: \"", value, "\": expected auto, float32 or bfloat16"));
}

std::string DTypeName(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    case c10::kFloat:
      return "float32";
    default:
      return c10::toString(dtype);
  }
}

}  // namespace asympo
