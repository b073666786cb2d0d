#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz in their own tree (clang,
# -DASYMPO_FUZZ=ON: the parsers' sources only, no LibTorch), replays every
# checked-in corpus once (ctest -L fuzz: the seeds and the inputs of past
# crashes), then fuzzes each target for a bounded time and prints its final
# libFuzzer line (executions, coverage) and a summary. Exit 1 when a replay
# fails or a target finds a crash; the input is then in
# $BUILD_DIR/findings/<target>/ (docs/security.md, "Fuzzing").
#
#   ./deploy/run_fuzz.sh                           # 60 s per target
#   ./deploy/run_fuzz.sh --seconds 300             # or FUZZ_SECONDS=300
#   ./deploy/run_fuzz.sh --seconds 30 wire_format  # some targets only
#   ./deploy/run_fuzz.sh --seconds 0               # build and replay only
#
# FUZZ_JOBS (default: nproc) targets are fuzzed at once. What a run adds to
# a target's corpus stays in $BUILD_DIR/corpus/<target>/ for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    -h | --help)
      echo "usage: deploy/run_fuzz.sh [--seconds N] [TARGET...]"
      echo
      sed -n '2,16s/^# \{0,1\}//p' "$0"
      exit 0 ;;
    -*) echo "run_fuzz: unknown option \"$1\"" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
# The largest input each target tries: a little above its largest seed
# (tokenizer.json: the 5 KB fixture of the tokenizer tests).
declare -A max_len=(
  [batch_validation]=4096 [snapshot_manifest]=4096 [wire_format]=1024
  [safetensors_header]=4096 [checkpoint_meta]=2048 [tokenizer_json]=16384
  [math_verifier]=512 [wire_check]=4096 [delta_codec]=2048
)
((${#targets[@]})) || targets=(batch_validation snapshot_manifest wire_format safetensors_header
  checkpoint_meta tokenizer_json math_verifier wire_check delta_codec)
for t in "${targets[@]}"; do
  [[ -n ${max_len[$t]:-} ]] || { echo "run_fuzz: no target \"$t\" (${!max_len[*]})" >&2; exit 2; }
done

# Timed legs (deploy/ci_legs.sh): printed by .ci/run when it set CI_TIMES.
source deploy/ci_legs.sh
./deploy/install_deps.sh >/dev/null
cmake -S . -B "$build_dir" -G Ninja -DASYMPO_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
# shellcheck disable=SC2046
ci_leg "fuzz build" cmake --build "$build_dir" -j "$(nproc)" -- $(printf '%s_fuzz ' "${targets[@]}")
ci_leg "fuzz replay" ctest --test-dir "$build_dir" --output-on-failure -L fuzz \
  -R "^Fuzz\.($(IFS='|'; echo "${targets[*]}"))\$"
((seconds > 0)) || exit 0

# One target: fuzz it, keep its log, print its last status line.
fuzz_one() {
  local t=$1 dir=$build_dir
  mkdir -p "$dir/corpus/$t" "$dir/findings/$t"
  touch "$dir/findings/$t/.started"
  local start=$SECONDS rc=0
  "$dir/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/findings/$t/" \
    "$dir/corpus/$t" "tests/fuzz/corpus/$t" >"$dir/findings/$t.log" 2>&1 || rc=$?
  local done_line corpus
  done_line=$(grep -E '^#[0-9]+[[:space:]]' "$dir/findings/$t.log" | tail -n 1 | tr -s '\t ' ' ')
  corpus=$(find "$dir/corpus/$t" -type f | wc -l)
  printf '%-20s %4ds  %s  (corpus %s files)  %s\n' "$t" $((SECONDS - start)) \
    "${done_line:-no status line}" "$corpus" "$([[ $rc == 0 ]] && echo ok || echo "CRASH rc=$rc")"
  if [[ $rc != 0 ]]; then
    grep -E 'ERROR|SUMMARY|fuzz property|Test unit written' "$dir/findings/$t.log" | head -n 8
    # The input itself, so that a finding on a machine that is gone (CI)
    # can be replayed: base64 -d into tests/fuzz/corpus/<target>/crash-...
    local f
    while IFS= read -r f; do
      echo "input $(basename "$f") ($(stat -c %s "$f") bytes), base64:"
      head -c 16384 "$f" | base64 -w 0
      echo
    done < <(find "$dir/findings/$t" -type f -newer "$dir/findings/$t/.started" ! -name .started)
    return 1
  fi
}
# xargs runs each target in a new bash: the function, the settings and the
# max_len table go with it.
export -f fuzz_one
export build_dir seconds max_len_table
max_len_table=$(declare -p max_len)

echo "run_fuzz: ${#targets[@]} targets, ${seconds} s each, $jobs at once"
status=0
fuzz_all() {
  printf '%s\n' "${targets[@]}" |
    xargs -P "$jobs" -I{} bash -c 'eval "$max_len_table"; fuzz_one "$1"' _ {}
}
ci_leg fuzzing fuzz_all || status=1
if ((status)); then
  echo "run_fuzz: a target crashed; inputs under $build_dir/findings/"
else
  echo "run_fuzz: no crash in ${#targets[@]} targets"
fi
exit $status
