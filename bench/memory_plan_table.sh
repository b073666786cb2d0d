#!/usr/bin/env bash
# The memory plan table of docs/operations.md ("Memory plan"): asympo-plan's
# peak per rank for the five named model shapes on 1, 8 and 16 GPUs of 80 GB,
# 8k-token sequences (one per micro-batch row, --micro_batch_tokens=8192),
# bfloat16 compute and snapshots, with ZeRO-1 (none on one GPU) and
# activation checkpointing none or layers, or full sharding (which
# recomputes every layer); training's peak (the largest of the step's
# phases) apart from rank 0's on its device while it gathers between steps
# (with full sharding the weights for every snapshot; a checkpoint gathers
# nothing: every rank writes its own part). Then the same models training
# rank-32 adapters on every projection (--lora_rank=32), the base frozen
# in bfloat16, on 1 and 8 GPUs, with the adapters' parameters and a
# version's bytes (the adapters in bfloat16).
#
#   bench/memory_plan_table.sh [BUILD_DIR]     (default: build)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
plan=${1:-build}/learner_server/asympo-plan
common=(--device=cuda --device_memory_gib=80 --micro_batch_tokens=8192 --compute_dtype=bfloat16
  --dtype=bfloat16)

# peaks ARGS...: "TRAIN GATHER", the largest training phase's total
# and rank 0's gather phase's (GiB) from asympo-plan's "phase totals" line.
peaks() {
  local out rc=0
  out=$("$plan" "${common[@]}" "$@") || rc=$?
  [[ $rc -le 3 ]] || { echo "asympo-plan $* failed ($rc)" >&2; exit 1; }
  sed -n 's/^phase totals (GiB): //p' <<<"$out" | tr ',' '\n' | awk '
    $1 == "rank-0" { ckpt = $NF; next }
    { v = $NF; if (v + 0 > train + 0) train = v }
    END { print train, ckpt }'
}

# cell TRAIN: "TRAIN" and whether it fits 80 GiB.
cell() { awk -v t="$1" 'BEGIN { printf "%s %s", t, (t + 0 <= 80 ? "fits" : "**no**") }'; }

echo "| model | GPUs | ZeRO-1, none | ZeRO-1, layers | full | rank 0 gathering: ZeRO-1 / full |"
echo "| --- | --- | --- | --- | --- | --- |"
for model in qwen3-0.6b qwen3-1.7b llama3.2-3b qwen3-4b qwen3-8b; do
  for world in 1 8 16; do
    shard=optimizer
    ((world == 1)) && shard=none
    read -r none_train _ < <(peaks --model="$model" --world_size="$world" --dist_shard="$shard")
    read -r layers_train zero1_ckpt < <(peaks --model="$model" --world_size="$world" \
      --dist_shard="$shard" --activation_checkpointing=layers)
    if ((world == 1)); then
      echo "| $model | 1 | $(cell "$none_train") | $(cell "$layers_train") | - | - |"
      continue
    fi
    read -r full_train full_ckpt < <(peaks --model="$model" --world_size="$world" --dist_shard=full)
    echo "| $model | $world | $(cell "$none_train") | $(cell "$layers_train") |" \
      "$(cell "$full_train") | $(cell "$zero1_ckpt") / $(cell "$full_ckpt") |"
  done
done

echo
echo "| model | GPUs | LoRA r32, none | LoRA r32, layers | LoRA r32, full | adapters | a version (bfloat16) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for model in qwen3-0.6b qwen3-1.7b llama3.2-3b qwen3-4b qwen3-8b; do
  for world in 1 8; do
    shard=optimizer
    ((world == 1)) && shard=none
    lora=(--model="$model" --world_size="$world" --lora_rank=32)
    read -r none_train _ < <(peaks "${lora[@]}" --dist_shard="$shard")
    read -r layers_train _ < <(peaks "${lora[@]}" --dist_shard="$shard" \
      --activation_checkpointing=layers)
    full="-"
    if ((world > 1)); then
      read -r full_train _ < <(peaks "${lora[@]}" --dist_shard=full)
      full=$(cell "$full_train")
    fi
    adapters=$("$plan" "${common[@]}" "${lora[@]}" --dist_shard="$shard" |
      sed -n 's/.*projection(s) a layer, \([0-9.]*M\) parameters.*/\1/p') || true
    mib=$(awk -v m="${adapters%M}" 'BEGIN { printf "%.0f MiB", m * 1e6 * 2 / 1048576 }')
    echo "| $model | $world | $(cell "$none_train") | $(cell "$layers_train") | $full |" \
      "$adapters | $mib |"
  done
done
