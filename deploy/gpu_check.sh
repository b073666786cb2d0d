#!/usr/bin/env bash
# The GPU node check, in parts that each fit one device call: builds the
# project against the CUDA LibTorch inside the node's PyTorch wheel (only the
# targets the part needs), runs the part's steps, and writes one report
# (gpu_report.md, gpu_report.json; deploy/gpu_report.py). docs/operations.md,
# "GPU nodes", gives the sequence of device calls and what each costs.
#
#   deploy/gpu_check.sh [PART...] [options]        # deploy/gpu_check.sh --help
#
# Every step runs under `timeout`, and the whole command stops starting steps
# so that it ends within --budget seconds (default 570, under a 600-s device
# call); a step that does not fit is recorded as skipped. After every step the
# logs and results are copied to --out (default $OUT), so a command killed
# from outside still brings back all that finished. The parts need no earlier
# part on the same machine: a fresh machine builds what the part needs, and
# `deploy/gpu_report.py DIR...` merges the results of parts run on different
# machines.
#
# The node needs CUDA, CMake, ninja and PyTorch. The Debian packages it lacks
# (gRPC, protobuf, Abseil, prometheus-cpp, glog, GoogleTest, ...) travel as
# .deb files (default .devdeps/, made by deploy/gpu_deps.sh on a Debian 12
# machine) and are unpacked with `dpkg -x` into a prefix, never installed.
# The benchmarks' twins need transformers; without it their rows stay empty.
# PEAK_TFLOPS overrides the bf16 dense peak used for MFU.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: deploy/gpu_check.sh [PART...] [options]

PARTS, run in the order given (default: all four; each fits one device
call of 8 minutes on a fresh H100 node, build included; --dry-run lists
their steps with timeouts and estimates):
  tests     build the gpu-labelled tests, run them one at a time
  train     training step, C++ against PyTorch (Qwen3-0.6B, 1.7B)
  generate  generation, C++ against transformers' static cache
            (Qwen3-0.6B, batch 64 and 256, 512 new tokens)
  transfer  snapshot transfer and gRPC wire, the trainer step with
            --broadcast_every 1, a 1-minute loop on the GPU

options:
  --budget S     end within S seconds (default 570): each step's timeout
                 is cut to what is left, a step with under 20 s is skipped
  --out DIR      copy logs and results there after every step (default $OUT)
  --timeout STEP=S  change one step's timeout (seconds; --dry-run lists the
                 steps); may be repeated
  --eval         run asympo-eval at the end of the loop (off by default)
  --all          part tests: also run every other test (needs a long budget)
  --deps DIR     folder of .deb files (default .devdeps)
  --prefix DIR   where they are unpacked (default /opt/asympo-deps)
  --build DIR    build tree (default build-gpu); logs in DIR/gpu-report
  --dry-run      print each part's steps with their timeouts; run nothing
  --no-tests     drop part tests; --no-bench drops train, generate and the
  --no-bench     transfer benchmarks; --no-loop drops the loop (the
  --no-loop      switches of the one-command check this replaces)
  -h, --help     this text
EOF
}

deps=.devdeps
prefix=/opt/asympo-deps
build=build-gpu
budget=570
out=${OUT:-}
all=0
eval_loop=0
dry=0
no_tests=0
no_bench=0
no_loop=0
parts=()
overrides=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    tests | train | generate | transfer) parts+=("$1") ;;
    --all) all=1 ;;
    --eval) eval_loop=1 ;;
    --dry-run) dry=1 ;;
    --no-tests) no_tests=1 ;;
    --no-bench) no_bench=1 ;;
    --no-loop) no_loop=1 ;;
    --deps | --prefix | --build | --budget | --out | --timeout)
      if (($# < 2)); then echo "gpu_check: $1 needs a value" >&2; exit 2; fi
      case "$1" in
        --deps) deps=$2 ;;
        --prefix) prefix=$2 ;;
        --build) build=$2 ;;
        --budget) budget=$2 ;;
        --out) out=$2 ;;
        --timeout) overrides+=("$2") ;;
      esac
      shift ;;
    *) echo "gpu_check: unknown argument \"$1\" (parts: tests train generate transfer; --help)" >&2; exit 2 ;;
  esac
  shift
done
if ! [[ $budget =~ ^[0-9]+$ ]] || ((budget < 30)); then
  echo "gpu_check: --budget \"$budget\": expected whole seconds, at least 30" >&2
  exit 2
fi
((${#parts[@]})) || parts=(tests train generate transfer)
selected=()
for p in "${parts[@]}"; do
  case $p in
    tests) ((no_tests)) && continue ;;
    train | generate) ((no_bench)) && continue ;;
    transfer) ((no_bench && no_loop)) && continue ;;
  esac
  [[ " ${selected[*]} " == *" $p "* ]] || selected+=("$p")
done
if ((${#selected[@]} == 0)); then
  echo "gpu_check: nothing to run (every part was switched off)" >&2
  exit 2
fi

logs=$build/gpu-report
t_start=$(date +%s)
deadline=$((t_start + budget))
reserve=15  # kept for the report and the last copy
say() { echo "gpu_check: $*"; }

# Every step's timeout in seconds, and each part's steps in order.
declare -A limit=(
  [configure]=150 [build]=300 [gpu_tests]=300 [all_tests]=1800
  [train-qwen3-0.6b-cpp]=120 [train-qwen3-0.6b-pytorch]=180
  [train-qwen3-1.7b-cpp]=150 [train-qwen3-1.7b-pytorch]=240
  [generate-b64-cpp]=90 [generate-b64-transformers]=200
  [generate-b256-cpp]=120 [generate-b256-transformers]=240
  [transfer-qwen3-1.7b]=120 [grpc-wire]=150 [publish-steps]=180
  [loop]=$((eval_loop ? 240 : 130))
)
# About how long each step takes on a fresh H100 node with 16 cores
# (docs/operations.md, "GPU nodes", says what each figure rests on). Each
# part builds only its targets, about 38% of the tree's compile time.
declare -A estimate=(
  [configure]=15 [build]=90 [all/build]=150
  [gpu_tests]=90 [all_tests]=900
  [train-qwen3-0.6b-cpp]=25 [train-qwen3-0.6b-pytorch]=60
  [train-qwen3-1.7b-cpp]=40 [train-qwen3-1.7b-pytorch]=90
  [generate-b64-cpp]=30 [generate-b64-transformers]=90
  [generate-b256-cpp]=45 [generate-b256-transformers]=120
  [transfer-qwen3-1.7b]=40 [grpc-wire]=60 [publish-steps]=75 [loop]=$((eval_loop ? 150 : 80))
)
for o in "${overrides[@]}"; do
  if ! [[ $o =~ ^([a-z0-9._-]+)=([0-9]+)$ && -n ${limit[${o%%=*}]:-} ]]; then
    echo "gpu_check: --timeout \"$o\": expected STEP=SECONDS for one of: ${!limit[*]}" >&2
    exit 2
  fi
  limit[${o%%=*}]=${o#*=}
done
steps_of() {
  echo configure build
  case $1 in
    tests) echo gpu_tests; ((all)) && echo all_tests ;;
    train) echo train-qwen3-0.6b-cpp train-qwen3-0.6b-pytorch train-qwen3-1.7b-cpp train-qwen3-1.7b-pytorch ;;
    generate) echo generate-b64-cpp generate-b64-transformers generate-b256-cpp generate-b256-transformers ;;
    transfer)
      ((no_bench)) || echo transfer-qwen3-1.7b grpc-wire publish-steps
      ((no_loop)) || echo loop ;;
  esac
}

if ((dry)); then
  say "budget ${budget} s; out ${out:-(none)}; build ${build}"
  for p in "${selected[@]}"; do
    total=0
    lines=()
    for s in $(steps_of "$p"); do
      e=${estimate[$s]}
      [[ $s == build ]] && ((all)) && [[ $p == tests ]] && e=${estimate[all/build]}
      total=$((total + e))
      lines+=("  step $s: timeout ${limit[$s]} s, about $e s")
    done
    echo "part $p (about $total s on a fresh H100 node):"
    printf '%s\n' "${lines[@]}"
  done
  exit 0
fi

mkdir -p "$logs"
sync_out() {
  [[ -n $out ]] || return 0
  mkdir -p "$out" && cp -r "$logs"/. "$out"/ 2>/dev/null
  return 0
}
trap sync_out EXIT

# Appends one JSON line to steps.jsonl: what a step did and how long it took.
record() {  # PART STEP STATUS RC SECONDS LIMIT
  printf '{"part": "%s", "step": "%s", "status": "%s", "rc": %s, "seconds": %s, "timeout_s": %s}\n' \
    "$@" >>"$logs/steps.jsonl"
}

# Runs one step under its timeout (cut to what the budget leaves); its stdout
# goes to LOG/NAME.out, its stderr to LOG/NAME.log. Returns the step's status.
run_step() {  # PART NAME CMD...
  local part=$1 name=$2 t=${limit[$2]:?no timeout for step $2}
  shift 2
  rm -f "$logs/$name.out" "$logs/$name.log"  # an earlier command's, on a warm machine
  local left=$((deadline - reserve - $(date +%s)))
  if ((left < 20)); then
    say "$part/$name: skipped, ${left} s of the budget left"
    record "$part" "$name" skipped null 0 "$t"
    return 124
  fi
  ((t > left)) && t=$left
  local t0 rc status took
  t0=$(date +%s)
  timeout --kill-after=10 "$t" "$@" >"$logs/$name.out" 2>"$logs/$name.log"
  rc=$?
  took=$(($(date +%s) - t0))
  case $rc in
    0) status=ok ;;
    124 | 137) status=timed_out ;;
    *) status=failed ;;
  esac
  say "$part/$name: $status after ${took} s (timeout ${t} s)"
  record "$part" "$name" "$status" "$rc" "$took" "$t"
  sync_out
  return "$rc"
}

# Tags the JSON objects of LOG/NAME.out with their case and implementation
# and appends them to bench.jsonl.
tag() {  # NAME CASE IMPL
  [[ -f $logs/$1.out ]] || return 0
  python3 - "$logs/$1.out" "$2" "$3" >>"$logs/bench.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        d["case"], d["impl"] = sys.argv[2], sys.argv[3]
        print(json.dumps(d))
PY
}

# --- the machine, once per command ---
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  sed 's/^/gpu_check: GPU /' || say "nvidia-smi not found"
torch_facts=$(timeout 60 python3 -c 'import torch
print(f"torch {torch.__version__} cuda {torch.version.cuda} available={torch.cuda.is_available()}")
print(torch.utils.cmake_prefix_path)' 2>/dev/null)
torch_line=$(sed -n 1p <<<"$torch_facts")
torch_prefix=$(sed -n 2p <<<"$torch_facts")
say "${torch_line:-python3 cannot import torch}"
if [[ -z $torch_prefix ]]; then
  say "python3 cannot import torch: no CUDA LibTorch to build against"
  exit 1
fi
if [[ -z ${PEAK_TFLOPS:-} ]]; then
  case "$gpu_name" in
    *H100*PCIe*) PEAK_TFLOPS=756 ;;
    *H100* | *H200* | *H800*) PEAK_TFLOPS=989 ;;
    *A100*) PEAK_TFLOPS=312 ;;
    *L40S*) PEAK_TFLOPS=362 ;;
    *) PEAK_TFLOPS=0 ;;
  esac
fi
[[ -z ${CUDA_HOME:-} && -d /usr/local/cuda ]] && CUDA_HOME=/usr/local/cuda

# The Debian packages, unpacked into the prefix once per machine.
if compgen -G "$deps/*.deb" >/dev/null; then
  if [[ ! -f $prefix/.unpacked ]]; then
    mkdir -p "$prefix"
    for f in "$deps"/*.deb; do dpkg -x "$f" "$prefix"; done
    # glog's CMake files name their find-modules by absolute path.
    glog_modules="$prefix/usr/lib/x86_64-linux-gnu/cmake/glog/glog-modules.cmake"
    [[ -f $glog_modules ]] && sed -i "s|\"/usr/share/glog/cmake\"|\"$prefix/usr/share/glog/cmake\"|" "$glog_modules"
    touch "$prefix/.unpacked"
    say "unpacked $(compgen -G "$deps/*.deb" | wc -l) packages into $prefix"
  fi
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

configure=(cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake;$torch_prefix"
  -DPKG_CONFIG_EXECUTABLE="$pkgconfig_bin" -DASYMPO_BUILD_BENCH=ON)
[[ -n ${CUDA_HOME:-} ]] && configure+=(-DCUDAToolkit_ROOT="$CUDA_HOME")

# The targets each part needs, so that a fresh machine builds only those.
targets_of() {
  case $1 in
    tests)
      if ((all)); then echo all; else
        echo rollout_server_gpu_tests learner_server_gpu_tests nccl_gpu_tests policy_logits \
          data_parallel_rank
      fi ;;
    train) echo model_bench ;;
    generate) echo model_bench engine_bench ;;
    transfer)
      echo publish_bench broadcast_bench asympo-learner asympo-rollout
      ((eval_loop)) && echo asympo-eval ;;
  esac
}

# Configures (once per tree) and builds the part's targets; 0 when built.
build_part() {  # PART
  local part=$1
  if [[ ! -f $build/build.ninja ]]; then
    run_step "$part" configure "${configure[@]}" || {
      tail -30 "$logs/configure.out" "$logs/configure.log" 2>/dev/null
      return 1
    }
    grep -h "ASymPO-RL: LibTorch\|CUDA graphs\|learner's ranks" "$logs/configure.out" | head -6
    grep -q "CUDA graphs on" "$logs/configure.out" ||
      say "WARNING: CUDA graphs are off in this build (configure.out)"
    grep -q "the learner's ranks have NCCL" "$logs/configure.out" ||
      say "WARNING: the learner's ranks have no NCCL in this build (configure.out, nccl_group_check.log)"
    cp "$logs/configure.out" "$logs/gpu_configure.log"
  fi
  # shellcheck disable=SC2046
  run_step "$part" build cmake --build "$build" -j "$(nproc)" --target $(targets_of "$part") || {
    grep -h -E "error|Error" "$logs/build.out" 2>/dev/null | head -30
    return 1
  }
}

part_tests() {
  build_part tests || return 1
  # One GPU: the gpu tests run one at a time (they also hold RESOURCE_LOCK gpu).
  run_step tests gpu_tests ctest --test-dir "$build" -L gpu --output-on-failure -j 1 --timeout 240
  local rc=$? rc_all=0
  if ((all)); then
    run_step tests all_tests ctest --test-dir "$build" -LE gpu --output-on-failure -j "$((2 * $(nproc)))"  # two slots a core (tests/CMakeLists.txt)
    rc_all=$?
  fi
  ((rc == 0 && rc_all == 0))
}

part_train() {
  build_part train || return 1
  local spec cfg batch args
  for spec in "qwen3-0.6b 8" "qwen3-1.7b 4"; do
    read -r cfg batch <<<"$spec"
    args=(--config "$cfg" --mode train --batch "$batch" --seq 1024 --response 768 --reps 5
      --peak_tflops "$PEAK_TFLOPS")
    run_step train "train-$cfg-cpp" "$build/bench/model_bench" "${args[@]}" --device cuda \
      --compute_dtype bfloat16
    tag "train-$cfg-cpp" "train $cfg" cpp
    run_step train "train-$cfg-pytorch" python3 bench/gpu_model_bench.py "${args[@]}"
    tag "train-$cfg-pytorch" "train $cfg" pytorch
  done
  return 0
}

part_generate() {
  build_part generate || return 1
  local batch args
  for batch in 64 256; do
    args=(--config qwen3-0.6b --mode generate --batch "$batch" --new_tokens 512 --reps 2)
    run_step generate "generate-b$batch-cpp" "$build/bench/model_bench" "${args[@]}" \
      --device cuda --dtype bfloat16 --temperature 1
    tag "generate-b$batch-cpp" "generate qwen3-0.6b batch $batch" cpp
    run_step generate "generate-b$batch-transformers" python3 bench/gpu_model_bench.py "${args[@]}"
    tag "generate-b$batch-transformers" "generate qwen3-0.6b batch $batch" transformers
  done
  # Continuous against static batching, long-tailed lengths (geometric, mean
  # 64, capped at 512), CUDA graphs on: one JSON line per slot count.
  run_step generate engine-batching "$build/bench/engine_bench" --mode batching \
    --config qwen3-0.6b --slots 64,256 --requests 512 --max_new 512 --reps 1 --device cuda \
    --dtype bfloat16
  return 0
}

part_transfer() {
  build_part transfer || return 1
  if ((!no_bench)); then
    run_step transfer transfer-qwen3-1.7b "$build/bench/publish_bench" --mode transfer \
      --config qwen3-1.7b --device cuda --dtype bfloat16
    tag transfer-qwen3-1.7b "transfer qwen3-1.7b" cpp
    # The gRPC wire for one billion bf16 parameters (2 GB = 500M float32's).
    run_step transfer grpc-wire "$build/bench/broadcast_bench" --params_m 500 --receivers 1 --reps 3
    cp "$logs/grpc-wire.out" "$logs/broadcast_bench.txt" 2>/dev/null
    # The table's header and its last row, cell by cell.
    grep '^|' "$logs/grpc-wire.out" 2>/dev/null |
      python3 -c 'import json,sys
rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in sys.stdin]
rows = [r for r in rows if not all(set(c) <= set("-: ") for c in r)]
if len(rows) >= 2:
    print(json.dumps({"case": "grpc_wire", "impl": "cpp", "columns": rows[0], "row": rows[-1]}))' \
      >>"$logs/bench.jsonl"
    run_step transfer publish-steps "$build/bench/publish_bench" --config qwen3-0.6b --device cuda \
      --dtype bfloat16 --groups 8 --responses 8 --tokens 248 --steps 5 --rounds 2 --malloc_tuned 1
    grep '^|' "$logs/publish-steps.out" >"$logs/publish_steps.md" 2>/dev/null
  fi
  if ((!no_loop)); then
    local eval_flag=(--no_eval)
    ((eval_loop)) && eval_flag=()
    rm -rf "$logs/loop"
    run_step transfer loop python3 deploy/local_run.py --build_dir "$build" \
      --device cuda --dtype bfloat16 --rollouts 1 --minutes 1 --out "$logs/loop" "${eval_flag[@]}"
    cp "$logs/loop.out" "$logs/loop.log" 2>/dev/null
  fi
  return 0
}

rc=0
for p in "${selected[@]}"; do
  t0=$(date +%s)
  say "part $p: starting ($((deadline - t0)) s of the budget left)"
  "part_$p"
  prc=$?
  ((prc != 0)) && rc=1
  graphs=$(grep -c 'CUDA graphs on' "$logs/gpu_configure.log" 2>/dev/null)
  cat >"$logs/facts-$p.json" <<JSON
{"part": "$p", "gpu": "$gpu_name", "peak_bf16_tflops": $PEAK_TFLOPS, "torch": "${torch_line//\"/}",
 "cuda_graphs_compiled": ${graphs:-0},
 "part_s": $(($(date +%s) - t0)), "rc": $prc, "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
JSON
  sync_out
done

timeout 60 python3 deploy/gpu_report.py "$logs" >/dev/null || say "the report could not be written"
sync_out
echo
cat "$logs/gpu_report.md" 2>/dev/null
say "total $(($(date +%s) - t_start)) s; report $logs/gpu_report.md${out:+, copied to $out}"
exit "$rc"
