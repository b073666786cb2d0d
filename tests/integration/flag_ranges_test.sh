#!/usr/bin/env bash
# Flags as an operator mistypes them: a numeric flag outside its documented
# range, or a malformed address, ends the program at start with exit 2 and
# a message naming the flag, the value and the range (or the address and
# what is wrong with it); --help shows every range; the daemons log their
# version and build first.
#
#   flag_ranges_test.sh BUILD_DIR
set -uo pipefail
build=$1
learner=$build/learner_server/asympo-learner
rollout=$build/rollout_server/asympo-rollout
eval_bin=$build/rollout_server/asympo-eval
submit=$build/rollout_server/asympo-submit
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

# refused BINARY EXPECTED_TEXT FLAG...: exit 2 and EXPECTED_TEXT on stderr.
refused() {
  local bin=$1 want=$2
  shift 2
  timeout 60 "$bin" "$@" >"$work/out" 2>"$work/err" </dev/null
  local rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$want" "$work/err"; then
    echo "FAIL: $(basename "$bin") $*: exit $rc, stderr: $(tail -c 400 "$work/err")"
    fails=$((fails + 1))
  else
    echo "ok: $(basename "$bin") $* -> $want"
  fi
}

refused "$learner" "--lr=1000000000: expected 0 to 1" --lr=1e9
refused "$learner" "--max_steps=-1: expected 0 to 1000000000000" --max_steps=-1
refused "$learner" "--checkpoint_every=-3: expected 0 to 1000000000000" --checkpoint_every=-3
refused "$learner" "--max_abs_reward=0: expected 1e-06 to 3.4e+38" --max_abs_reward=0
refused "$learner" "--retry_after=2h: expected 0 to 1h" --retry_after=2h
refused "$learner" "--quarantine_window=0: expected 1s to 168h" --quarantine_window=0
# A reward EMA noisier than the alert rules can judge (docs/metrics.md).
refused "$learner" "--collapse_ema_alpha=0.5: expected 1e-06 to 0.1" --collapse_ema_alpha=0.5
refused "$learner" '--listen=garbage: has no port' --listen=garbage --metrics_address=
refused "$learner" '--metrics_address=notaport: has no port' --metrics_address=notaport
refused "$learner" "--max_steps=abc: Illegal value 'abc'" --max_steps=abc
refused "$learner" "--seed=-1: Illegal value '-1'" --seed -1
refused "$learner" "--lr=nan: expected 0 to 1" --lr=nan
refused "$learner" "--weight_group=tcp: expected off, gloo or nccl" --weight_group=tcp
refused "$learner" "--weight_group=nccl broadcasts from the learner's GPU: it needs --device=cuda" \
  --weight_group=nccl
refused "$learner" "--weight_group_timeout=0: expected 100ms to 1h" --weight_group_timeout=0
refused "$rollout" "--top_p=2: expected 0 to 1" --top_p=2
refused "$rollout" "--group_size=1: expected 2 to 4096" --group_size=1
refused "$eval_bin" "--k=-1: expected 0 to 65536" --k=-1
refused "$submit" "--groups_per_batch=0: expected 1 to 65536" --groups_per_batch=0

# The one-machine launcher checks its own options the same way.
src=$(cd "$(dirname "$0")/../.." && pwd)
refused /usr/bin/python3 "--lr 1000000000.0: expected 0 to 1" "$src/deploy/local_run.py" --lr 1e9
refused /usr/bin/python3 "--rollouts -1: expected 0 to 64" "$src/deploy/local_run.py" --rollouts=-1

for bin in "$learner" "$rollout" "$eval_bin" "$submit"; do
  help=$("$bin" --help 2>/dev/null)
  if ! grep -q "; range " <<<"$help"; then
    echo "FAIL: $(basename "$bin") --help shows no range"
    fails=$((fails + 1))
  fi
done
help=$("$learner" --help 2>/dev/null)
grep -qF -- "--lr (default: 1e-06; range 0 to 1)" <<<"$help" ||
  { echo "FAIL: --help does not show --lr's range"; fails=$((fails + 1)); }
# The flags both daemons share are defined once (common/daemon/daemon_main.cc)
# and still listed, with their ranges, by each daemon's --help.
for bin in "$learner" "$rollout"; do
  help=$("$bin" --help 2>/dev/null)
  for want in "--threads (default: 1; range 1 to 1024)" "--tiny_vocab_size (default: 64; range 2 to" \
      "--run_name (default: \"\")" "--metrics_insecure (default: false)"; do
    grep -qF -- "$want" <<<"$help" ||
      { echo "FAIL: $(basename "$bin") --help lacks $want"; fails=$((fails + 1)); }
  done
done
refused "$rollout" "--threads=0: expected 1 to 1024" --threads=0
refused "$learner" "--tiny_vocab_size=1: expected 2 to 1048576" --tiny_vocab_size=1

# The daemons log their version before anything else can fail.
timeout 60 "$learner" --listen=garbage --metrics_address= >/dev/null 2>"$work/err"
grep -q "starting asympo-learner [0-9.]* (ASymPO-RL, " "$work/err" ||
  { echo "FAIL: the learner does not log its version: $(head -c 300 "$work/err")"; fails=$((fails + 1)); }

[[ $fails -eq 0 ]] && echo PASS || { echo "$fails failed"; exit 1; }
