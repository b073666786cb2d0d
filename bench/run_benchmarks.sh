#!/usr/bin/env bash
# Runs the benchmark programs and prints their Markdown tables; paste them
# into docs/benchmarks.md with the date and machine. Build first:
#   cmake --build build -j"$(nproc)"
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
echo "<!-- $(date -u +%Y-%m-%d) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) -->"
"$build_dir/bench/loss_bench" --reps "${REPS:-9}"
"$build_dir/bench/broadcast_bench" --reps "${REPS:-5}"
"$build_dir/bench/broadcast_bench" --reps "${REPS:-5}" --malloc_tuned 1
"$build_dir/bench/publish_bench" --config 100m --groups 2 --responses 4 --tokens 32 --steps 4 --rounds 3 --dtype bfloat16 --malloc_tuned 1 | grep '^|'
"$build_dir/bench/publish_bench" --mode transfer --config 100m --dtype bfloat16 --reps 3
"$build_dir/bench/engine_bench" --mode batching --config tiny --slots 32,128 --reps 3 --threads 1
"$build_dir/bench/engine_bench" --mode prefill --config tiny --groups 8,16 --reps 3
