#!/usr/bin/env bash
# One command that checks a GPU node: builds the project against the CUDA
# LibTorch inside the node's PyTorch wheel and runs every `gpu`-labelled test
# (and, with --all, the whole suite), printing a short table last.
#
# The node needs CUDA, CMake, ninja and PyTorch. The Debian packages it
# lacks (gRPC, protobuf, Abseil, prometheus-cpp, glog, GoogleTest, PCRE2,
# ICU, nlohmann-json, pkg-config) travel as .deb files in a folder (default
# .devdeps/) made on a Debian 12 machine with deploy/gpu_deps.sh; they are
# unpacked with `dpkg -x` into a prefix, never installed over the system.
#
#   deploy/gpu_deps.sh                  # on a Debian 12 machine with apt
#   deploy/gpu_check.sh [--all] [--deps DIR] [--prefix DIR] [--build DIR]
#
# Writes the build log and the test log under $OUT (or build-gpu/) and
# exits non-zero when the build or a test fails. docs/operations.md, "GPU
# nodes", explains each step.
set -uo pipefail
cd "$(dirname "$0")/.."

deps=.devdeps
prefix=/opt/asympo-deps
build=build-gpu
all=0
while (($#)); do
  case "$1" in
    --all) all=1 ;;
    --deps) deps=$2; shift ;;
    --prefix) prefix=$2; shift ;;
    --build) build=$2; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
logs=${OUT:-$build}
mkdir -p "$logs"
t_start=$(date +%s)
say() { echo "gpu_check: $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  sed 's/^/gpu_check: GPU /' || say "nvidia-smi not found"
python3 - <<'PY' || { say "python3 cannot import torch"; exit 1; }
import torch
print(f"gpu_check: torch {torch.__version__} cuda {torch.version.cuda} "
      f"available={torch.cuda.is_available()} cxx11_abi={torch._C._GLIBCXX_USE_CXX11_ABI}")
PY
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')

# 1. The Debian packages, unpacked into a prefix.
if compgen -G "$deps/*.deb" >/dev/null; then
  mkdir -p "$prefix"
  for f in "$deps"/*.deb; do dpkg -x "$f" "$prefix"; done
  say "unpacked $(ls "$deps"/*.deb | wc -l) packages into $prefix"
  # glog's CMake files name their find-modules by absolute path.
  glog_modules="$prefix/usr/lib/x86_64-linux-gnu/cmake/glog/glog-modules.cmake"
  [[ -f $glog_modules ]] && sed -i "s|\"/usr/share/glog/cmake\"|\"$prefix/usr/share/glog/cmake\"|" "$glog_modules"
else
  say "no .deb files in $deps; using the system's packages"
fi
lib="$prefix/usr/lib/x86_64-linux-gnu"
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
# .pc files say prefix=/usr: point their -I/-L paths into the unpacked tree.
export PKG_CONFIG_SYSROOT_DIR="$prefix"
pkgconfig_bin=$(command -v pkg-config || command -v pkgconf || echo "$prefix/usr/bin/pkgconf")

# 2. Configure and build against the CUDA LibTorch.
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake;$torch_prefix" \
  -DPKG_CONFIG_EXECUTABLE="$pkgconfig_bin" \
  -DASYMPO_BUILD_BENCH=ON >"$logs/gpu_configure.log" 2>&1
rc=$?
if ((rc != 0)); then
  tail -40 "$logs/gpu_configure.log"
  say "configure FAILED (log: $logs/gpu_configure.log)"
  exit 1
fi
grep -E "ASymPO-RL: LibTorch|CUDA" "$logs/gpu_configure.log" | head -5
cmake --build "$build" -j "$(nproc)" >"$logs/gpu_build.log" 2>&1
rc=$?
t_build=$(($(date +%s) - t0))
if ((rc != 0)); then
  grep -E "error|Error" "$logs/gpu_build.log" | head -40
  say "build FAILED after ${t_build}s (log: $logs/gpu_build.log)"
  exit 1
fi
say "built in ${t_build}s"

# 3. The GPU tests (they skip themselves without a GPU), then optionally all.
t0=$(date +%s)
ctest --test-dir "$build" -L gpu --output-on-failure -j 4 2>&1 | tee "$logs/gpu_tests.log"
rc_gpu=${PIPESTATUS[0]}
t_gpu=$(($(date +%s) - t0))
rc_all=0
if ((all)); then
  ctest --test-dir "$build" -LE gpu --output-on-failure -j "$(nproc)" >"$logs/all_tests.log" 2>&1
  rc_all=$?
  tail -15 "$logs/all_tests.log"
fi

echo
echo "| check | result |"
echo "| --- | --- |"
echo "| build (CUDA LibTorch) | ${t_build} s |"
echo "| gpu-labelled tests | $(grep -E 'tests passed' "$logs/gpu_tests.log" | tail -1) (${t_gpu} s) |"
grep -cE "Skipped|\*\*\*Skipped" "$logs/gpu_tests.log" >/dev/null &&
  echo "| gpu tests skipped | $(grep -cE '\*\*\*Skipped' "$logs/gpu_tests.log") |"
((all)) && echo "| other tests | $(grep -E 'tests passed' "$logs/all_tests.log" | tail -1) |"
echo "| total | $(($(date +%s) - t_start)) s |"
((rc_gpu == 0 && rc_all == 0))
