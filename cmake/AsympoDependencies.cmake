# Finds every third-party dependency once, for the whole tree.
# On Debian 12 all of these come from packages (deploy/install_deps.sh); on a
# GPU machine pass -DCMAKE_PREFIX_PATH with the CUDA LibTorch from the PyTorch
# wheel and the unpacked Debian packages (docs/operations.md).

find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(glog CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
# No version: Debian's TorchConfig reports none.
find_package(Torch REQUIRED)
message(STATUS "ASymPO-RL: LibTorch ${Torch_VERSION} at ${Torch_DIR}")
# A LibTorch built with CUDA (the one inside a CUDA PyTorch wheel) defines the
# torch_cuda target (and finds libc10_cuda). Then the CUDA-only pieces (CUDA
# graphs for the decode step, rollout_server/decode_graph_cuda.cc) are
# compiled in, with the CUDA toolkit's headers, and linked to LibTorch's CUDA
# libraries; without them the CPU build compiles its eager stand-ins.
set(ASYMPO_WITH_CUDA OFF)
set(ASYMPO_TORCH_CUDA_LIBS "")
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES OR C10_CUDA_LIBRARY)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(ASYMPO_WITH_CUDA ON)
    foreach(t torch_cuda c10_cuda)
      if(TARGET ${t})
        list(APPEND ASYMPO_TORCH_CUDA_LIBS ${t})
      endif()
    endforeach()
    if(C10_CUDA_LIBRARY AND NOT TARGET c10_cuda)
      list(APPEND ASYMPO_TORCH_CUDA_LIBS ${C10_CUDA_LIBRARY})
    endif()
    message(STATUS "ASymPO-RL: LibTorch has CUDA; CUDA graphs on (CUDA ${CUDAToolkit_VERSION} headers at ${CUDAToolkit_INCLUDE_DIRS}; links ${ASYMPO_TORCH_CUDA_LIBS})")
  else()
    message(WARNING "ASymPO-RL: LibTorch has CUDA but the CUDA toolkit's headers were not found "
      "(set CUDAToolkit_ROOT): CUDA graphs off, decoding stays eager")
  endif()
else()
  message(STATUS "ASymPO-RL: LibTorch without CUDA; CPU only")
endif()

# libstdc++ first in every binary's list of shared libraries. The LibTorch
# inside PyTorch >= 2.5 wheels exports its own statically linked copies of
# libstdc++'s std::filesystem functions (pytorch/pytorch#133437); the dynamic
# linker binds a call to the first library in that list that defines the
# symbol, which was libtorch_cpu, and every std::filesystem call then
# crashed (seen on a GPU node with PyTorch 2.11, docs/operations.md). Named
# first, libstdc++ provides them. Harmless with Debian's LibTorch.
add_link_options("LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")

if(ASYMPO_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()

# protoc and the gRPC plugin: prefer the targets, fall back to PATH.
if(TARGET protobuf::protoc)
  set(ASYMPO_PROTOC $<TARGET_FILE:protobuf::protoc>)
else()
  find_program(ASYMPO_PROTOC protoc REQUIRED)
endif()
if(TARGET gRPC::grpc_cpp_plugin)
  set(ASYMPO_GRPC_PLUGIN $<TARGET_FILE:gRPC::grpc_cpp_plugin>)
else()
  find_program(ASYMPO_GRPC_PLUGIN grpc_cpp_plugin REQUIRED)
endif()

# NCCL is never linked and needs no header: weight_broadcaster/nccl declares
# the few NCCL/CUDA types it uses and opens libnccl / libcudart at run time
# (dlopen), so one binary starts everywhere, with or without a GPU.
