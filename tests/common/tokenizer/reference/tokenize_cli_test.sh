#!/usr/bin/env bash
# ctest TokenizeCli: asympo-tokenize's modes and its errors, on the small
# tiny_tokenizer.json beside this script (bytes are ids 0..255; "hello" is
# 259, " world" 264, <|end|> 265 (special), <think> 266).
#
#   tokenize_cli_test.sh ASYMPO_TOKENIZE_BINARY WORK_DIR
set -uo pipefail

bin=$1
work=$2
tok="$(cd "$(dirname "$0")" && pwd)/tiny_tokenizer.json"
mkdir -p "$work"
passed=0
failed=0

# check NAME EXPECTED_RC EXPECTED_SUBSTRING -- COMMAND...: runs COMMAND with
# stdin from $stdin_text, requires its exit status and a substring of its
# stdout+stderr.
stdin_text=""
check() {
  local name=$1 want_rc=$2 want_out=$3
  shift 4
  local out rc
  out=$(printf '%s' "$stdin_text" | "$@" 2>&1)
  rc=$?
  if [[ $rc -eq $want_rc && $out == *"$want_out"* ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name: exit $rc (want $want_rc), output:"
    echo "$out" | head -n 5
    echo "  wanted substring: $want_out"
  fi
}

# --help lists every flag with its meaning and exits 0 (help_version_test.sh
# checks the rest of --help and --version).
check "help" 0 "encodes text to token ids" -- "$bin" --help
help=$("$bin" --help 2>&1)
for flag in tokenizer text decode ids add_special_tokens skip_special_tokens jsonl_in \
    jsonl_out field out_field; do
  if [[ $help == *"--$flag ("* ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL --help does not describe --$flag"
  fi
done

check "encode --text" 0 "259 264 265" -- "$bin" --tokenizer="$tok" --text="hello world<|end|>"
stdin_text="hello world"
check "encode stdin" 0 "259 264" -- "$bin" --tokenizer="$tok"
stdin_text="259, 264
265"
check "decode stdin" 0 "hello world<|end|>" -- "$bin" --tokenizer="$tok" --decode
stdin_text=""
check "decode --ids" 0 "<think>hello" -- "$bin" --tokenizer="$tok" --decode --ids="266 259 265" \
  --skip_special_tokens
check "decode unknown id" 1 "token id 9999 at position 1" -- \
  "$bin" --tokenizer="$tok" --decode --ids="259 9999"
check "decode non-number" 1 '"abc" is not a token id' -- \
  "$bin" --tokenizer="$tok" --decode --ids="259 abc"
check "missing tokenizer file" 1 "$work/missing.json: cannot open" -- \
  "$bin" --tokenizer="$work/missing.json" --text=x
check "no --tokenizer" 2 "--tokenizer is required" -- "$bin" --text=x
stdin_text=$'a\xffb'
check "invalid UTF-8 on stdin" 1 "invalid UTF-8 at byte 1" -- "$bin" --tokenizer="$tok"
stdin_text=""

# JSONL: ids added after the other fields, which keep their order.
printf '%s\n' '{"id": 7, "prompt": "hello world", "answer": "4"}' '' \
  '{"prompt": "<think>hello"}' >"$work/in.jsonl"
check "jsonl ok" 0 "" -- "$bin" --tokenizer="$tok" --jsonl_in="$work/in.jsonl" \
  --jsonl_out="$work/out.jsonl"
want=$'{"id":7,"prompt":"hello world","answer":"4","prompt_tokens":[259,264]}\n{"prompt":"<think>hello","prompt_tokens":[266,259]}'
if [[ "$(cat "$work/out.jsonl" 2>/dev/null)" == "$want" ]]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAIL jsonl output:"
  cat "$work/out.jsonl"
fi
check "jsonl custom fields to stdout" 0 '"question":"hello","ids":[259]' -- \
  "$bin" --tokenizer="$tok" --jsonl_in=<(echo '{"question": "hello"}') --jsonl_out=- \
  --field=question --out_field=ids

printf '%s\n' '{"prompt": "a"}' '{"prompt": "b"' >"$work/bad_json.jsonl"
check "jsonl bad line" 1 "bad_json.jsonl:2: not valid JSON" -- \
  "$bin" --tokenizer="$tok" --jsonl_in="$work/bad_json.jsonl" --jsonl_out="$work/bad.out"
if [[ -e "$work/bad.out" || -e "$work/bad.out.tmp" ]]; then
  failed=$((failed + 1))
  echo "FAIL jsonl bad line: left an output file behind"
else
  passed=$((passed + 1))
fi
printf '%s\n' '{"prompt": 5}' >"$work/bad_field.jsonl"
check "jsonl field not a string" 1 'bad_field.jsonl:1: field "prompt" is number' -- \
  "$bin" --tokenizer="$tok" --jsonl_in="$work/bad_field.jsonl" --jsonl_out=-
printf '%s\n' '[1, 2]' >"$work/not_object.jsonl"
check "jsonl line not an object" 1 "not_object.jsonl:1: is array" -- \
  "$bin" --tokenizer="$tok" --jsonl_in="$work/not_object.jsonl" --jsonl_out=-
check "jsonl missing input" 1 "cannot open" -- \
  "$bin" --tokenizer="$tok" --jsonl_in="$work/none.jsonl"

echo "tokenize cli: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
