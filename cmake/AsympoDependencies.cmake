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
# graphs for the decode step, rollout_server/engine/decode_graph_cuda.cc) are
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

# The dependencies' headers before LibTorch's. The LibTorch inside PyTorch
# wheels ships headers of its own under torch/include, among them an older
# protobuf (torch/include/google/protobuf, seen with PyTorch 2.11). Its
# -isystem folder comes before the dependencies' on the command line, so a TU
# that includes LibTorch and a generated .pb.h picked up the wrong protobuf
# and failed to compile. Where LibTorch's include folder holds one of the
# folders below and a dependency's include folder holds it too, a folder of
# links in the build tree points to the dependency's copy and is searched
# first. Debian's LibTorch ships none of them: then nothing changes.
set(_asympo_dep_roots "")
foreach(t protobuf::libprotobuf gRPC::grpc++ absl::base nlohmann_json::nlohmann_json glog::glog)
  if(TARGET ${t})
    get_target_property(_dirs ${t} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs)
      list(APPEND _asympo_dep_roots ${_dirs})
    endif()
  endif()
endforeach()
list(APPEND _asympo_dep_roots ${Protobuf_INCLUDE_DIRS})
list(REMOVE_DUPLICATES _asympo_dep_roots)
set(_asympo_shim "${CMAKE_BINARY_DIR}/dependency_headers_first")
set(_asympo_shimmed "")
foreach(name google absl grpc grpcpp nlohmann glog gflags gtest gmock prometheus)
  set(_in_torch OFF)
  foreach(torch_root ${TORCH_INCLUDE_DIRS})
    if(IS_DIRECTORY "${torch_root}/${name}" AND NOT "${torch_root}" IN_LIST _asympo_dep_roots)
      set(_in_torch ON)
    endif()
  endforeach()
  if(NOT _in_torch)
    continue()
  endif()
  foreach(dep_root ${_asympo_dep_roots})
    if(IS_DIRECTORY "${dep_root}/${name}")
      file(MAKE_DIRECTORY "${_asympo_shim}")
      file(REMOVE "${_asympo_shim}/${name}")
      file(CREATE_LINK "${dep_root}/${name}" "${_asympo_shim}/${name}" SYMBOLIC)
      list(APPEND _asympo_shimmed "${name} (${dep_root})")
      break()
    endif()
  endforeach()
endforeach()
if(_asympo_shimmed)
  include_directories(BEFORE SYSTEM "${_asympo_shim}")
  message(STATUS "ASymPO-RL: LibTorch ships headers the dependencies also have; theirs come first: ${_asympo_shimmed}")
endif()

# libstdc++ first in every binary's list of shared libraries. The LibTorch
# inside PyTorch >= 2.5 wheels exports its own statically linked copies of
# libstdc++'s std::filesystem functions (pytorch/pytorch#133437); the dynamic
# linker binds a call to the first library in that list that defines the
# symbol, which was libtorch_cpu, and every std::filesystem call then
# crashed (seen on a GPU node with PyTorch 2.11, docs/operations.md). Named
# first, libstdc++ provides them. Harmless with Debian's LibTorch. It did not
# keep std::filesystem::remove_all off LibTorch's copy (a learner died at its
# first checkpoint pruning on such a node): trees are removed with POSIX
# calls instead (common/remove_tree.h).
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
