#!/usr/bin/env bash
# Learning with a tool, with the loss masks and without: bench/episode_learning
# for seeds 0-2, masked and unmasked, two runs at a time, one CSV per run
# (a finished run is skipped when the script runs again), then a table of
# the held-out greedy accuracy and the last 20 steps' reward.
#
#   bench/episode_learning.sh BUILD_DIR OUT_DIR [extra flags for every run]
set -euo pipefail
build=$1 out=$2
shift 2
extra=("$@")
mkdir -p "$out"
run() {  # seed, unmasked
  local name="seed$1-$([ "$2" = 1 ] && echo unmasked || echo masked)"
  [ -s "$out/$name.csv" ] && return 0
  "$build/bench/episode_learning" --seed "$1" --unmasked "$2" --threads 1 \
    --csv "$out/$name.csv.part" "${extra[@]}" > "$out/$name.log" 2>&1
  mv "$out/$name.csv.part" "$out/$name.csv"
}
for seed in 0 1 2; do
  run "$seed" 0 "$@" &
  run "$seed" 1 "$@" &
  wait
done
python3 - "$out" <<'PY'
import csv, glob, os, sys
out = sys.argv[1]
print("| run | held-out greedy accuracy (step: acc) | reward, first 20 steps | reward, last 20 steps | calls/episode, last 20 |")
print("| --- | --- | --- | --- | --- |")
for path in sorted(glob.glob(os.path.join(out, "*.csv"))):
    rows = list(csv.DictReader(open(path)))
    train = [r for r in rows if r["reward"] != ""]
    evals = ["%s: %.3f" % (r["step"], float(r["heldout_greedy_acc"])) for r in rows if r["heldout_greedy_acc"] != ""]
    mean = lambda rs, k: sum(float(r[k]) for r in rs) / max(len(rs), 1)
    print("| %s | %s | %.3f | %.3f | %.2f |" % (os.path.basename(path)[:-4], ", ".join(evals),
          mean(train[:20], "reward"), mean(train[-20:], "reward"), mean(train[-20:], "calls_per_episode")))
PY
