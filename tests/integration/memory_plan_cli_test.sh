#!/usr/bin/env bash
# The memory plan as an operator meets it: asympo-plan exits 0 when the plan
# fits, 3 when it does not (saying what would make it fit), 2 for a bad flag
# (naming it); asympo-learner refuses to start when its plan does not fit
# the device (exit 2, before binding anything), naming the flags to change.
#
#   memory_plan_cli_test.sh BUILD_DIR
set -uo pipefail
build=$1
plan=$build/learner_server/asympo-plan
learner=$build/learner_server/asympo-learner
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

# expect RC TEXT BINARY ARGS...: exit RC and TEXT on stdout or stderr.
expect() {
  local want_rc=$1 want=$2 bin=$3
  shift 3
  timeout 60 "$bin" "$@" >"$work/out" 2>"$work/err" </dev/null
  local rc=$?
  if [[ $rc -ne $want_rc ]] || ! grep -qF -- "$want" "$work/out" "$work/err"; then
    echo "FAIL: $(basename "$bin") $*: exit $rc (want $want_rc), want \"$want\";" \
      "stdout: $(tail -c 600 "$work/out"); stderr: $(tail -c 400 "$work/err")"
    fails=$((fails + 1))
  else
    echo "ok: $(basename "$bin") $* -> $rc, $want"
  fi
}

# Fits: exit 0, the table, the largest micro-batch.
expect 0 "fits," "$plan" --model=qwen3-0.6b --world_size=8 --dist_shard=optimizer \
  --micro_batch_tokens=8192
expect 0 "largest --micro_batch_tokens that fits:" "$plan" --model=qwen3-0.6b \
  --micro_batch_tokens=4096
expect 0 "snapshot staging in host memory" "$plan" --model=llama3.2-3b --world_size=8 \
  --dist_shard=full --dtype=bfloat16 --checkpoints=false --micro_batch_tokens=8192
# Does not fit: exit 3 and the flags to change.
expect 3 "does not fit" "$plan" --model=qwen3-8b --micro_batch_tokens=8192
expect 3 "to fit: lower --micro_batch_tokens to" "$plan" --model=qwen3-1.7b --world_size=8 \
  --dist_shard=optimizer --micro_batch_tokens=65536 --max_sequence_tokens=8192
expect 3 "does not fit" "$plan" --model=qwen3-0.6b --device=cpu --device_memory_gib=4 \
  --micro_batch_tokens=8192
# A model directory's config.json.
mkdir -p "$work/model"
cat >"$work/model/config.json" <<'EOF'
{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
EOF
expect 0 "$work/model" "$plan" --model="$work/model" --device=cpu --device_memory_gib=8 \
  --micro_batch_tokens=1024
# Bad flags: exit 2, the flag named.
expect 2 "--model is required" "$plan"
expect 2 "--model=nope" "$plan" --model=nope
expect 2 "--dist_shard: \"half\"" "$plan" --model=qwen3-8b --dist_shard=half
expect 2 "--device: \"gpu\"" "$plan" --model=qwen3-8b --device=gpu
expect 2 "--compute_dtype: \"fp16\"" "$plan" --model=qwen3-8b --compute_dtype=fp16
expect 2 "--dtype: \"int8\"" "$plan" --model=qwen3-8b --dtype=int8
expect 2 "--activation_checkpointing: " "$plan" --model=qwen3-8b --activation_checkpointing=some
expect 2 "--world_size=0: expected 1 to 65536" "$plan" --model=qwen3-8b --world_size=0
expect 2 "--dist_shard=full with a world of 1 rank" "$plan" --model=qwen3-8b --dist_shard=full
expect 2 "--micro_batch_tokens=0: expected 1 to" "$plan" --model=qwen3-8b --micro_batch_tokens=0
expect 2 "--device_memory_gib=0: expected 0.001 to" "$plan" --model=qwen3-8b --device_memory_gib=0
expect 2 "--max_sequence_tokens=-1: expected 0 to" "$plan" --model=qwen3-8b \
  --max_sequence_tokens=-1
expect 2 "--logprob_chunk_rows=0: expected 1 to" "$plan" --model=qwen3-8b --logprob_chunk_rows=0
# The learner: its plan does not fit, it stops at start naming the flags.
expect 2 "lower --micro_batch_tokens to" "$learner" --device_memory_gib=1 \
  --max_prompt_tokens=1024 --max_response_tokens=1024 --metrics_address= --listen=127.0.0.1:0
expect 2 "(--device_memory_gib=0.001)" "$learner" --device_memory_gib=0.001 --metrics_address= \
  --listen=127.0.0.1:0
expect 2 "--device_memory_gib=-2: expected -1 to" "$learner" --device_memory_gib=-2 \
  --metrics_address=
# It logs its plan before anything else fails.
expect 2 "memory plan per rank: tiny" "$learner" --device_memory_gib=1 --metrics_address= \
  --listen=127.0.0.1:0

exit $((fails > 0))
