#!/usr/bin/env bash
# Learning with a tool, with the loss masks and without: bench/episode_learning
# for seeds 0-2, masked and unmasked, two runs at a time, one CSV per run
# (a finished run is skipped when the script runs again), then a table of
# the held-out greedy accuracy and the last 20 steps' reward. Each masked
# run records its trajectories (seedN-masked.traj, not kept in git: a run
# is deterministic, and a missing one is recorded again); then
# seedN-unmasked-replayed trains without masks on exactly those trajectories.
#
#   bench/episode_learning.sh BUILD_DIR OUT_DIR [extra flags for every run]
set -euo pipefail
build=$1 out=$2
shift 2
extra=("$@")
mkdir -p "$out"
run() {  # seed, masked | unmasked | unmasked-replayed
  local name="seed$1-$2" flags=()
  [ -s "$out/$name.csv" ] && return 0
  case "$2" in
    masked) flags=(--record "$out/$name.traj.part") ;;
    unmasked) flags=(--unmasked 1) ;;
    unmasked-replayed)
      if [ ! -s "$out/seed$1-masked.traj" ]; then  # a checkout without it: record it again
        "$build/bench/episode_learning" --seed "$1" --threads 1 --record "$out/seed$1-masked.traj.part" \
          --csv "$out/seed$1-masked.rerecord.csv" "${extra[@]}" > "$out/seed$1-masked.rerecord.log" 2>&1
        # The same run, or the trajectories are not the masked run's.
        if ! diff <(cut -d, -f1-4 "$out/seed$1-masked.csv") <(cut -d, -f1-4 "$out/seed$1-masked.rerecord.csv") \
            > /dev/null; then
          echo "seed $1: the masked run recorded again differs from seed$1-masked.csv" >&2
          return 1
        fi
        rm "$out/seed$1-masked.rerecord.csv" "$out/seed$1-masked.rerecord.log"
        mv "$out/seed$1-masked.traj.part" "$out/seed$1-masked.traj"
      fi
      flags=(--unmasked 1 --replay "$out/seed$1-masked.traj") ;;
  esac
  "$build/bench/episode_learning" --seed "$1" --threads 1 "${flags[@]}" \
    --csv "$out/$name.csv.part" "${extra[@]}" > "$out/$name.log" 2>&1
  mv "$out/$name.csv.part" "$out/$name.csv"
  if [ "$2" = masked ]; then mv "$out/$name.traj.part" "$out/$name.traj"; fi
}
for seed in 0 1 2; do
  run "$seed" masked &
  run "$seed" unmasked &
  wait
done
run 0 unmasked-replayed &
run 1 unmasked-replayed &
wait
run 2 unmasked-replayed
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
