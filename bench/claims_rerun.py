#!/usr/bin/env python3
"""Reruns claims-experiment runs from their committed result files and
says how the rerun compares: each file's recorded command with this
checkout's bench/task_learning, from the repository root (the command
names the committed base model), its per-step rows written under --work.

    python3 bench/claims_rerun.py [--build_dir build] [--work /tmp/claims-rerun] [--seed S]
        docs/results/claims-10seeds/grid/spo_lr3e-05_lag4_seed3.json [...]

On the file's own seed the rerun is compared with the committed rows
(csv/NAME.csv.gz) and evaluation, line by line: "the same, bit for bit",
or the first step that differs (exit 1). The runs use one thread and
fixed seeds, so on one machine they repeat exactly; a CPU whose LibTorch
kernels round differently can diverge after some steps, and a rerun that
diverged is then judged as a new sample of its cell, as below. With --seed
(a seed of your choosing) the rerun is a new sample of the file's cell:
its mean@k against the cell's other seeds on file (mean, sd and the 95%
prediction interval of one more seed, mean ± t(0.975, n-1) sd
sqrt(1 + 1/n)). Each rerun's result (the same fields as the committed
file's) is written to --work/NAME.json."""
import argparse
import gzip
import math
import os
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import claims_stats as cs  # noqa: E402
from claims_experiment import analyse, read_json, run_name, write_json  # noqa: E402
from staleness_experiment import read_rows, run_logged  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(recorded, build_dir, csv_path, seed):
    """The recorded command with this build's task_learning, the rows
    written to csv_path and, when given, another seed."""
    argv = shlex.split(recorded)
    if not argv or os.path.basename(argv[0]) != "task_learning" or "--csv" not in argv or "--seed" not in argv:
        raise ValueError("not a task_learning command with --csv and --seed: %r" % recorded[:200])
    argv[0] = os.path.join(os.path.abspath(build_dir), "bench", "task_learning")
    argv[argv.index("--csv") + 1] = csv_path
    if seed is not None:
        argv[argv.index("--seed") + 1] = str(seed)
    return argv


def first_difference(rerun_csv, committed_gz):
    """None when the two row files are equal line by line, else the first
    difference in words."""
    with open(rerun_csv) as f:
        mine = f.read().splitlines()
    with gzip.open(committed_gz, "rt") as f:
        theirs = f.read().splitlines()
    if mine == theirs:
        return None
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return "row %d differs (%s against the committed %s)" % (i, a[:80], b[:80])
    return "%d rows against the committed %d" % (len(mine) - 1, len(theirs) - 1)


def cell_scores(path, run, k, leave_out=None):
    """mean@k (k a string) of every run on file in the same folder and cell (objective,
    lr, lag, mini-batches), by seed, but for seed `leave_out`."""
    folder, out = {}, os.path.dirname(path)
    for name in os.listdir(out):
        if name.endswith(".json"):
            r = read_json(os.path.join(out, name))
            if r["seed"] != leave_out and all(
                    r.get(f) == run.get(f) for f in ("objective", "lr", "lag", "minibatches", "steps")):
                folder[r["seed"]] = r["eval"].get("mean@" + k, float("nan"))
    return folder


def against_cell(score, scores):
    """Where `score` lies against the cell's seeds on file ({seed: mean@k})."""
    values = [v for v in scores.values() if v == v]
    if len(values) < 2:
        return "the cell has %d seed%s on file: no spread to compare with" % (len(values), "" if values else "s")
    m, sd, n = statistics.mean(values), statistics.stdev(values), len(values)
    half = cs.t_quantile(0.975, n - 1) * sd * math.sqrt(1 + 1.0 / n)
    inside = m - half <= score <= m + half
    return "the cell's %d seeds: %.3f ± %.3f; 95%% prediction interval of one more seed [%.3f, %.3f]: %s" % (
        n, m, sd, m - half, m + half, "inside" if inside else "OUTSIDE")


def rerun(path, a):
    run = read_json(path)
    seed = run["seed"] if a.seed is None else a.seed
    name = run_name(run["objective"], run["lr"], run["lag"], seed, run.get("minibatches", 1))
    csv_path, log_path = os.path.join(a.work, name + ".csv"), os.path.join(a.work, name + ".log")
    argv = command(run["command"], a.build_dir, csv_path, seed)
    seconds, final = run_logged(argv, name, log_path, cwd=ROOT)
    rows = read_rows(csv_path)
    k = next((key.split("@")[1] for key in run["eval"] if key.startswith("mean@")), "8")
    value = {"rerun_of": path, "seed": seed, "command": shlex.join(argv), "seconds": round(seconds, 1),
             "eval": final, **analyse(rows)}
    write_json(os.path.join(a.work, name + ".json"), value)
    score = final.get("mean@" + k, float("nan"))
    if seed == run["seed"]:
        gz = os.path.join(os.path.dirname(os.path.dirname(path)), "csv", os.path.basename(path)[:-5] + ".csv.gz")
        diff = first_difference(csv_path, gz) if os.path.exists(gz) else "no committed rows (%s)" % gz
        if diff is None and final != run["eval"]:
            diff = "the evaluation differs: %s against the committed %s" % (final, run["eval"])
        # A rerun that diverged (another CPU's rounding) is a new sample of
        # its cell: judged against the cell's other seeds.
        print("%s: mean@%s %.3f (committed %.3f), %.0f s: %s" % (
            name, k, score, run["eval"].get("mean@" + k, float("nan")), seconds,
            "the same, bit for bit" if diff is None else "DIFFERENT: %s; as a new sample of its cell: %s" % (
                diff, against_cell(score, cell_scores(path, run, k, leave_out=seed)))), flush=True)
        return diff is None
    print("%s: mean@%s %.3f, %.0f s; %s" % (
        name, k, score, seconds, against_cell(score, cell_scores(path, run, k, leave_out=seed))), flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="result files of bench/claims_experiment.py (sweep/, grid/, batches/)")
    ap.add_argument("--build_dir", default="build")
    ap.add_argument("--work", default="/tmp/claims-rerun", help="where the reruns' rows, logs and results go")
    ap.add_argument("--seed", type=int, default=None, help="rerun on this seed instead of the file's")
    a = ap.parse_args()
    a.work = os.path.abspath(a.work)
    os.makedirs(a.work, exist_ok=True)
    if not os.access(os.path.join(a.build_dir, "bench", "task_learning"), os.X_OK):
        sys.exit("claims_rerun: no %s/bench/task_learning (build the project first)" % a.build_dir)
    same = True
    for path in a.files:
        try:
            same = rerun(os.path.abspath(path), a) and same
        except (ValueError, KeyError, OSError, RuntimeError) as e:
            sys.exit("claims_rerun: %s: %s" % (path, e))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
