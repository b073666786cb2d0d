#!/usr/bin/env bash
# Learning on `add` from the claims' base model with low-rank adapters
# against full training: bench/task_learning runs of 400 steps (asympo,
# 8 prompts x 8 responses, lag 0), held-out mean@8 over 1000 prompts at
# the end. Full training at its best lr (1e-4: docs/results.md, the sweep);
# adapters (rank 8 on every projection, alpha 16) at the lrs of --lrs,
# seed 0 first, then seeds 1 and 2 at the best of them. One result file
# per run (<name>.json, asympo-eval's JSON; a finished run is skipped when
# the script runs again), two runs at a time, then a table.
#
#   bench/lora_learning.sh BUILD_DIR OUT_DIR [--lrs 3e-4,1e-3,3e-3]
# The base model is made first when OUT_DIR/base/model is missing (the
# claims experiment's command: supervised steps on the task's solutions to
# 40% greedy accuracy, about 5 minutes).
set -euo pipefail
build=$1 out=$2
shift 2
lrs=3e-4,1e-3,3e-3
[[ ${1:-} == --lrs ]] && lrs=$2
mkdir -p "$out"
base=$out/base/model
if [[ ! -f $base/config.json ]]; then
  "$build/bench/task_learning" --task add --layers 4 --hidden 128 --sft_steps 3000 \
    --sft_eval_every 25 --sft_target 0.4 --sft_batch 64 --sft_lr 1e-3 --steps 0 \
    --save_model "$base" --base_stats 64 --group 8 --threads 1 --seed 0 > "$out/base.log" 2>&1
fi
run() {  # name, lr, seed, extra flags...
  local name=$1 lr=$2 seed=$3
  shift 3
  [[ -s $out/$name.json ]] && return 0
  "$build/bench/task_learning" --task add --init_model "$base" --objective asympo --lr "$lr" \
    --lag 0 --seed "$seed" --steps 400 --group 8 --prompts 8 --eval_k 8 --log_every 50 \
    --csv "$out/$name.csv" --threads 1 --base_stats 0 --eval_json "$out/$name.json.part" \
    "$@" > "$out/$name.log" 2>&1
  mv "$out/$name.json.part" "$out/$name.json"
}
lora=(--lora_rank 8 --lora_alpha 16)
IFS=, read -r -a lr_list <<<"$lrs"
pids=()
run full_lr1e-4_seed0 1e-4 0 &
pids+=($!)
for lr in "${lr_list[@]}"; do
  run "lora_lr${lr}_seed0" "$lr" 0 "${lora[@]}" &
  pids+=($!)
  if ((${#pids[@]} >= 2)); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
best=$(python3 - "$out" "$lrs" <<'PY'
import json, os, sys
out, lrs = sys.argv[1], sys.argv[2].split(",")
score = {lr: json.load(open(os.path.join(out, "lora_lr%s_seed0.json" % lr)))["mean_at_k"] for lr in lrs}
print(max(lrs, key=lambda lr: score[lr]))
PY
)
for seed in 1 2; do
  run "full_lr1e-4_seed$seed" 1e-4 "$seed" &
  run "lora_lr${best}_seed$seed" "$best" "$seed" "${lora[@]}" &
  wait
done
python3 - "$out" "$best" <<'PY'
import json, os, sys, statistics
out, best = sys.argv[1], sys.argv[2]
def row(name):
    return json.load(open(os.path.join(out, name + ".json")))
print("| run | lr | mean@8 per seed | mean | greedy accuracy (mean) |")
print("| --- | --- | --- | --- | --- |")
for label, prefix, lr in (("full training", "full_lr1e-4", "1e-4"), ("LoRA r8", "lora_lr" + best, best)):
    rows = [row("%s_seed%d" % (prefix, s)) for s in range(3)]
    m = [r["mean_at_k"] for r in rows]
    print("| %s | %s | %s | %.3f | %.3f |" % (label, lr, ", ".join("%.3f" % x for x in m),
          statistics.mean(m), statistics.mean(r["greedy_accuracy"] for r in rows)))
PY
