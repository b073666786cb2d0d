// Where the policy runs and in what precision: the daemons' --device,
// --compute_dtype and --threads flags.
//
// Devices are "cpu", "cuda" (the first GPU) or "cuda:N". A CUDA device is
// only accepted when this LibTorch was built with CUDA and the GPU is
// visible, so that a bad flag fails at start-up, not at the first kernel.
#pragma once

#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include "absl/status/statusor.h"

namespace asympo {

// Parses and checks a device flag value. INVALID_ARGUMENT for a malformed
// value ("gpu", "cuda:x", "cuda:-1"); FAILED_PRECONDITION when CUDA is asked
// for and this build has no CUDA, no GPU is visible, or the index is beyond
// the visible GPUs. Messages name the flag and the value
// (`--device: "cuda:3": only 1 CUDA device(s) are visible ...`), as
// ParseModelDType's do.
absl::StatusOr<c10::Device> ParseDevice(const std::string& value);

// The number of CUDA devices this process can use (0 without CUDA).
int CudaDeviceCount();

// Parses a compute-dtype flag value: "auto" (bfloat16 on a CUDA device,
// float32 on the CPU), "float32" or "bfloat16". INVALID_ARGUMENT naming
// --compute_dtype and the value otherwise.
absl::StatusOr<c10::ScalarType> ParseComputeDType(const std::string& value,
                                                  const c10::Device& device);

// "float32", "bfloat16", "float16" (the names the flags and config.json use).
std::string DTypeName(c10::ScalarType dtype);

// Caps the CPU threads of this process's tensor work at `threads` (the
// daemons' --threads): LibTorch's intra-op threads and, where the BLAS is
// OpenBLAS (Debian's LibTorch), OpenBLAS's own thread pool, which
// at::set_num_threads leaves at one thread per core. Left alone, that pool's
// idle threads spin in sched_yield between two matrix products (a third of
// a profiled decode run's samples were in the kernel scheduler;
// docs/benchmarks.md). Returns the threads OpenBLAS was set to, or 0 where
// this process has no OpenBLAS.
int SetCpuThreads(int threads);

}  // namespace asympo
