#!/usr/bin/env bash
# Side-by-side model benchmarks: the C++ policy (build/bench/model_bench)
# against the equivalent PyTorch program (bench/model_bench.py, Debian's
# python3-torch, the same LibTorch 1.13 underneath). Runs are interleaved,
# ROUNDS times each, and the table reports medians and their ratios.
#
#   ROUNDS=3 THREADS=1 ONLY=tiny bench/run_model_bench.sh
# ONLY keeps the cases whose name contains it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
threads=${THREADS:-1}
bin=${BUILD_DIR:-build}/bench/model_bench
py="/usr/bin/python3 bench/model_bench.py"

# name | config | mode | extra args
cases=(
  "tiny train (32 x 64 tokens, the local run's shape)|tiny|train|--batch 32 --seq 64 --response 48"
  "tiny train (8 x 256 tokens)|tiny|train|--batch 8 --seq 256 --response 192"
  "tiny generate (8 prompts, 64 new tokens)|tiny|generate|--batch 8 --new_tokens 64"
  "100M train (4 x 256 tokens)|100m|train|--batch 4 --seq 256 --response 192 --reps 3"
  "100M generate (4 prompts, 32 new tokens)|100m|generate|--batch 4 --new_tokens 32 --reps 3"
)

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -E "s/.*\"$1\": ([0-9.e+-]+).*/\1/"; }

echo "<!-- $(date -u +%Y-%m-%d) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads=$threads, rounds=$rounds -->"
echo "| case | C++ tokens/s | PyTorch tokens/s | ratio | C++ FLOP/s |"
echo "| --- | ---: | ---: | ---: | ---: |"
for c in "${cases[@]}"; do
  IFS='|' read -r name config mode extra <<<"$c"
  [[ -n ${ONLY:-} && $name != *"$ONLY"* ]] && continue
  cpp=(); pyt=(); flops=()
  for ((r = 0; r < rounds; r++)); do
    # shellcheck disable=SC2086
    out=$("$bin" --config "$config" --mode "$mode" --threads "$threads" $extra)
    cpp+=("$(echo "$out" | field tokens_per_s)")
    [[ $mode == train ]] && flops+=("$(echo "$out" | field flops)")
    # shellcheck disable=SC2086
    pyt+=("$($py --config "$config" --mode "$mode" --threads "$threads" $extra | field tokens_per_s)")
  done
  c_med=$(printf '%s\n' "${cpp[@]}" | median)
  p_med=$(printf '%s\n' "${pyt[@]}" | median)
  f_med=$([[ ${#flops[@]} -gt 0 ]] && printf '%s\n' "${flops[@]}" | median || echo "")
  ratio=$(awk -v a="$c_med" -v b="$p_med" 'BEGIN {printf "%.2fx", a / b}')
  fl=$([[ -n $f_med ]] && awk -v f="$f_med" 'BEGIN {printf "%.1f G", f / 1e9}' || echo "-")
  printf '| %s | %.0f | %.0f | %s | %s |\n' "$name" "$c_med" "$p_med" "$ratio" "$fl"
done
mm=$("$bin" --mode matmul --threads "$threads" --reps 5 | field flops)
awk -v f="$mm" 'BEGIN {printf "\nMatmul peak (2048 x 2048 float32, %s thread(s)): %.1f GFLOP/s\n", "'"$threads"'", f / 1e9}'
