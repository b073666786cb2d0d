#!/usr/bin/env bash
# One command that checks a GPU node and measures every GPU figure: builds
# the project against the CUDA LibTorch inside the node's PyTorch wheel,
# runs every `gpu`-labelled test (and, with --all, the whole suite), runs the
# GPU benchmarks side by side with their PyTorch/transformers twins, runs a
# short real loop (learner + one rollout on the same GPU, tiny model), and
# writes one report: gpu_report.md and gpu_report.json (deploy/gpu_report.py).
#
# The node needs CUDA, CMake, ninja and PyTorch. The Debian packages it
# lacks (gRPC, protobuf, Abseil, prometheus-cpp, glog, GoogleTest, PCRE2,
# ICU, nlohmann-json, pkg-config) travel as .deb files in a folder (default
# .devdeps/) made on a Debian 12 machine with deploy/gpu_deps.sh; they are
# unpacked with `dpkg -x` into a prefix, never installed over the system.
#
#   deploy/gpu_deps.sh                  # on a Debian 12 machine with apt
#   deploy/gpu_check.sh [--all] [--no-tests] [--no-bench] [--no-loop]
#                       [--deps DIR] [--prefix DIR] [--build DIR]
#
# Writes the logs, bench.jsonl and the report under BUILD/gpu-report/ (kept
# between runs, so that the parts can run as separate commands: the whole
# check takes about 10 minutes; `--no-bench --no-loop` then `--no-tests`
# splits it in two, and the report merges what both left), copies them to
# $OUT when that is set, and exits non-zero when the build or a test fails.
# The benchmarks' twins need transformers; without it their rows stay empty
# in the report (bench.log says why).
# PEAK_TFLOPS overrides the bf16 dense peak used for MFU (otherwise taken
# from the GPU's name). docs/operations.md, "GPU nodes", explains each step.
set -uo pipefail
cd "$(dirname "$0")/.."

deps=.devdeps
prefix=/opt/asympo-deps
build=build-gpu
all=0
bench=1
loop=1
tests=1
while (($#)); do
  case "$1" in
    --all) all=1 ;;
    --no-bench) bench=0 ;;
    --no-loop) loop=0 ;;
    --no-tests) tests=0 ;;
    --deps) deps=$2; shift ;;
    --prefix) prefix=$2; shift ;;
    --build) build=$2; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
logs=$build/gpu-report
mkdir -p "$logs"
# Whatever happens, what was written reaches $OUT (a device machine's results folder).
trap '[[ -n ${OUT:-} ]] && cp -r "$logs"/. "$OUT"/ 2>/dev/null' EXIT
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
# The CUDA toolkit's headers, for the CUDA-graph code (cmake finds nvcc on PATH too).
[[ -z ${CUDA_HOME:-} && -d /usr/local/cuda ]] && CUDA_HOME=/usr/local/cuda

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
  ${CUDA_HOME:+-DCUDAToolkit_ROOT="$CUDA_HOME"} \
  -DASYMPO_BUILD_BENCH=ON >"$logs/gpu_configure.log" 2>&1
rc=$?
if ((rc != 0)); then
  tail -40 "$logs/gpu_configure.log"
  say "configure FAILED (log: $logs/gpu_configure.log)"
  exit 1
fi
grep -E "ASymPO-RL: LibTorch|CUDA" "$logs/gpu_configure.log" | head -5
grep -q "CUDA graphs on" "$logs/gpu_configure.log" || say "WARNING: CUDA graphs are off in this build (see gpu_configure.log)"
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
rc_gpu=0
if ((tests)); then
  ctest --test-dir "$build" -L gpu --output-on-failure -j 4 2>&1 | tee "$logs/gpu_tests.log"
  rc_gpu=${PIPESTATUS[0]}
fi
t_gpu=$(($(date +%s) - t0))
rc_all=0
if ((all)); then
  ctest --test-dir "$build" -LE gpu --output-on-failure -j "$(nproc)" >"$logs/all_tests.log" 2>&1
  rc_all=$?
  tail -15 "$logs/all_tests.log"
fi

# 4. Benchmarks, each C++ program beside its PyTorch twin in this one run.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [[ -z ${PEAK_TFLOPS:-} ]]; then
  case "$gpu_name" in
    *H100*PCIe*) PEAK_TFLOPS=756 ;;
    *H100* | *H200* | *H800*) PEAK_TFLOPS=989 ;;
    *A100*) PEAK_TFLOPS=312 ;;
    *L40S*) PEAK_TFLOPS=362 ;;
    *) PEAK_TFLOPS=0 ;;
  esac
fi
jsonl="$logs/bench.jsonl"
tag() { python3 -c 'import json,sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line); d["case"] = sys.argv[1]; d["impl"] = sys.argv[2]; print(json.dumps(d))' "$1" "$2" >>"$jsonl"; }
t0=$(date +%s)
if ((bench)); then
  : >"$jsonl"
  mb="$build/bench/model_bench"
  for spec in "qwen3-0.6b 8" "qwen3-1.7b 4"; do
    read -r cfg batch <<<"$spec"
    args=(--config "$cfg" --mode train --batch "$batch" --seq 1024 --response 768 --reps 5 --peak_tflops "$PEAK_TFLOPS")
    "$mb" "${args[@]}" --device cuda --compute_dtype bfloat16 2>>"$logs/bench.log" | tag "train $cfg" cpp
    python3 bench/gpu_model_bench.py "${args[@]}" 2>>"$logs/bench.log" | tag "train $cfg" pytorch
  done
  for batch in 64 256; do
    args=(--config qwen3-0.6b --mode generate --batch "$batch" --new_tokens 512 --reps 2)
    "$mb" "${args[@]}" --device cuda --dtype bfloat16 --temperature 1 2>>"$logs/bench.log" |
      tag "generate qwen3-0.6b batch $batch" cpp
    python3 bench/gpu_model_bench.py "${args[@]}" 2>>"$logs/bench.log" |
      tag "generate qwen3-0.6b batch $batch" transformers
  done
  "$build/bench/publish_bench" --mode transfer --config qwen3-1.7b --device cuda --dtype bfloat16 \
    2>>"$logs/bench.log" | tag "transfer qwen3-1.7b" cpp
  # The gRPC wire for one billion bf16 parameters (2 GB = 500M float32's).
  "$build/bench/broadcast_bench" --params_m 500 --receivers 1 --reps 3 2>>"$logs/bench.log" |
    tee "$logs/broadcast_bench.txt" | grep '^|' | tail -2 |
    python3 -c 'import json,sys; print(json.dumps({"line": " ".join(l.strip() for l in sys.stdin)}))' |
    tag grpc_wire cpp
  "$build/bench/publish_bench" --config qwen3-0.6b --device cuda --dtype bfloat16 --groups 8 \
    --responses 8 --tokens 248 --steps 5 --rounds 2 --malloc_tuned 1 2>>"$logs/bench.log" | tee "$logs/publish_steps.txt" |
    grep '^|' >"$logs/publish_steps.md"
fi
t_bench=$(($(date +%s) - t0))

# 5. A short real loop on the GPU.
if ((loop)); then
  python3 deploy/local_run.py --build_dir "$build" --device cuda --dtype bfloat16 --rollouts 1 \
    --minutes 1 --out "$logs/loop" >"$logs/loop.log" 2>&1 || say "the loop exited non-zero (log: $logs/loop.log)"
fi

# 6. The report.
cat >"$logs/facts.json" <<JSON
{"gpu": "$gpu_name", "peak_bf16_tflops": $PEAK_TFLOPS,
 "torch": "$(python3 -c 'import torch; print(torch.__version__)')",
 "cuda_graphs_compiled": "$(grep -c 'CUDA graphs on' "$logs/gpu_configure.log")",
 "build_s": $t_build, "gpu_tests_s": $t_gpu, "bench_s": $t_bench,
 "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
JSON
python3 deploy/gpu_report.py "$logs" || say "the report could not be written"

echo
echo "| check | result |"
echo "| --- | --- |"
echo "| build (CUDA LibTorch) | ${t_build} s |"
echo "| gpu-labelled tests | $(grep -E 'tests passed' "$logs/gpu_tests.log" 2>/dev/null | tail -1) (${t_gpu} s) |"
((all)) && echo "| other tests | $(grep -E 'tests passed' "$logs/all_tests.log" | tail -1) |"
echo "| benchmarks | ${t_bench} s |"
echo "| report | $logs/gpu_report.md, $logs/gpu_report.json |"
echo "| total | $(($(date +%s) - t_start)) s |"
((rc_gpu == 0 && rc_all == 0))
