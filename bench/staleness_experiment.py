#!/usr/bin/env python3
"""The staleness experiment: every objective at several staleness bounds and
seeds, on a built-in task, with the in-process loop of bench/task_learning
(--lag k samples each step with the weights of k steps before). Writes a
results page (table and plots) and the raw per-step rows.

    python3 bench/staleness_experiment.py [--build_dir build] [--jobs 2]
        [--steps 600] [--seeds 0,1,2] [--lags 0,4,16] [--task copy]
        [--objectives naive,gpg,grpo,spo,asympo,asympo_stable]
        [--out build/staleness] [--results docs/results.md]

Each run ends with asympo-eval's measures on the task's held-out prompts
(greedy accuracy, mean@8, pass@8). Collapse, as docs/results.md defines it:
the 20-step mean reward falls below half of its running peak (once that
peak exceeds 0.1). The learner's collapse gauge (CollapseDetector, default
options) is fed the same rewards; its delay and false alarms are reported.
"""
import argparse
import concurrent.futures
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import time

OBJECTIVES = ["naive", "gpg", "grpo", "spo", "asympo", "asympo_stable"]
EVAL = re.compile(r"^eval step=(\d+) (.*)$", re.M)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build_dir", default="build")
    ap.add_argument("--out", default="build/staleness", help="per-run CSV and logs")
    ap.add_argument("--results", default="docs/results.md", help="the page written ('' to skip)")
    ap.add_argument("--plots", default="docs/results", help="folder of the plots")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lags", default="0,4,16")
    ap.add_argument("--task", default="copy")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2,
                    help="transformer layers (the grid on docs/results.md was measured with 2; "
                         "the built-in tiny model has 3)")
    return ap.parse_args()


def run_one(args, objective, lag, seed):
    name = "%s_lag%d_seed%d" % (objective, lag, seed)
    csv_path = os.path.join(args.out, name + ".csv")
    log_path = os.path.join(args.out, name + ".log")
    cmd = [os.path.join(args.build_dir, "bench", "task_learning"), "--task", args.task,
           "--objective", objective, "--lag", str(lag), "--seed", str(seed),
           "--steps", str(args.steps), "--lr", repr(args.lr), "--group", str(args.group),
           "--prompts", str(args.prompts), "--vocab", str(args.vocab), "--log_every", "100",
           "--layers", str(args.layers),
           "--csv", csv_path, "--threads", "1"]
    seconds, final = run_logged(cmd, name, log_path)
    return {"objective": objective, "lag": lag, "seed": seed, "csv": csv_path,
            "seconds": seconds, "eval": final}


def run_logged(cmd, name, log_path, cwd=None):
    """Runs one task_learning command (in cwd, by default this process's)
    with its output in log_path: (seconds, its last evaluation line as
    numbers, {} without one)."""
    start = time.time()
    with open(log_path, "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    seconds = time.time() - start
    if rc != 0:
        raise RuntimeError("%s failed (exit %d): see %s" % (name, rc, log_path))
    with open(log_path) as f:
        evals = EVAL.findall(f.read())
    final = dict(kv.split("=", 1) for kv in evals[-1][1].split()) if evals else {}
    return seconds, {k: float(v) for k, v in final.items()}


def read_rows(path):
    with open(path) as f:
        return [{k: float(v) if v != "" else float("nan") for k, v in row.items()} for row in csv.DictReader(f)]


def analyse(rows):
    """Collapse step (or None), the gauge's first firing at or after it, and
    whether the gauge fired in a run that did not collapse."""
    rewards = [r["reward"] for r in rows]
    peak, collapse = 0.0, None
    for i in range(19, len(rewards)):
        mean20 = sum(rewards[i - 19:i + 1]) / 20
        peak = max(peak, mean20)
        if collapse is None and peak > 0.1 and mean20 < 0.5 * peak:
            collapse = int(rows[i]["step"])
    fired = [int(r["step"]) for r in rows if r["collapse_suspected"] >= 0.5]
    gauge_after = next((s for s in fired if collapse is not None and s >= collapse), None)
    gauge_before = next((s for s in fired if collapse is not None and s < collapse), None)
    last = rows[-20:]
    return {
        "collapse_step": collapse,
        "gauge_delay": (gauge_after - collapse) if gauge_after is not None else None,
        "gauge_early": gauge_before,
        "false_fire": collapse is None and bool(fired),
        "fired_steps": len(fired),
        "final_reward": statistics.mean(r["reward"] for r in last),
        "final_accuracy": statistics.mean(r["accuracy"] for r in last),
        "ratio": statistics.mean(r["naive_ratio"] for r in last),
        "clip_low": statistics.mean(r["clip_low"] for r in last),
        "clip_high": statistics.mean(r["clip_high"] for r in last),
        "nll": statistics.mean(r["mean_nll"] for r in last),
    }


def fmt_mean(values, digits=2):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return "%.*f" % (digits, values[0])
    return "%.*f ± %.*f" % (digits, statistics.mean(values), digits, statistics.stdev(values))


def table(runs, objectives, lags):
    lines = ["| objective | lag | final reward | greedy acc (held-out) | mean@8 | pass@8 | collapsed runs (step) | S_N/S_P | clip low / high | mean NLL |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for objective in objectives:
        for lag in lags:
            rs = [r for r in runs if r["objective"] == objective and r["lag"] == lag]
            if not rs:
                continue
            a = [r["analysis"] for r in rs]
            collapsed = [x["collapse_step"] for x in a if x["collapse_step"] is not None]
            lines.append("| `%s` | %d | %s | %s | %s | %s | %d of %d%s | %s | %s / %s | %s |" % (
                objective, lag, fmt_mean([x["final_reward"] for x in a]),
                fmt_mean([r["eval"].get("greedy_acc") for r in rs]),
                fmt_mean([r["eval"].get("mean@8") for r in rs]),
                fmt_mean([r["eval"].get("pass@8") for r in rs]),
                len(collapsed), len(rs), (" (" + ", ".join(str(c) for c in collapsed) + ")") if collapsed else "",
                fmt_mean([x["ratio"] for x in a]), fmt_mean([x["clip_low"] for x in a], 3),
                fmt_mean([x["clip_high"] for x in a], 3), fmt_mean([x["nll"] for x in a], 3)))
    return "\n".join(lines)


def gauge_summary(runs):
    collapsed = [r for r in runs if r["analysis"]["collapse_step"] is not None]
    healthy = [r for r in runs if r["analysis"]["collapse_step"] is None]
    delays = [r["analysis"]["gauge_delay"] for r in collapsed if r["analysis"]["gauge_delay"] is not None]
    missed = [r for r in collapsed if r["analysis"]["gauge_delay"] is None]
    early = [r for r in collapsed if r["analysis"]["gauge_early"] is not None]
    false = [r for r in healthy if r["analysis"]["false_fire"]]
    return {"collapsed_runs": len(collapsed), "healthy_runs": len(healthy),
            "delays": delays, "missed": len(missed), "fired_before_collapse": len(early),
            "false_fire_runs": len(false),
            "false_fire_steps": sum(r["analysis"]["fired_steps"] for r in false)}


def plot(runs, objectives, lags, folder, steps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("staleness_experiment: matplotlib missing, no plots", file=sys.stderr)
        return []
    os.makedirs(folder, exist_ok=True)
    written = []
    for column, label, name in (("reward", "reward (20-step mean)", "reward"),
                                ("naive_ratio", "S_N / S_P (20-step mean)", "ratio")):
        fig, axes = plt.subplots(1, len(lags), figsize=(5 * len(lags), 4), sharey=True, squeeze=False)
        for ax, lag in zip(axes[0], lags):
            for objective in objectives:
                rs = [r for r in runs if r["objective"] == objective and r["lag"] == lag]
                if not rs:
                    continue
                series = [[row[column] for row in read_rows(r["csv"])] for r in rs]
                n = min(len(s) for s in series)
                mean = [statistics.mean(s[i] for s in series) for i in range(n)]
                smooth = [statistics.mean(mean[max(0, i - 19):i + 1]) for i in range(n)]
                ax.plot(range(1, n + 1), smooth, label=objective)
            ax.set_title("lag %d steps" % lag)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(label + ", mean of seeds")
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(folder, "staleness_%s.png" % name)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main():
    args = parse_args()
    objectives = args.objectives.split(",")
    lags = [int(x) for x in args.lags.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    for o in objectives:
        if o not in OBJECTIVES:
            sys.exit("staleness_experiment: --objectives: unknown objective %r" % o)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    jobs = [(o, l, s) for l in lags for o in objectives for s in seeds]
    runs = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for run in pool.map(lambda j: run_one(args, *j), jobs):
            run["analysis"] = analyse(read_rows(run["csv"]))
            runs.append(run)
            print("%-14s lag %-3d seed %d: final reward %.3f, greedy acc %.3f, collapse at %s (%.0f s)" % (
                run["objective"], run["lag"], run["seed"], run["analysis"]["final_reward"],
                run["eval"].get("greedy_acc", float("nan")), run["analysis"]["collapse_step"],
                run["seconds"]), flush=True)
    wall = time.time() - start
    gauge = gauge_summary(runs)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"args": vars(args), "wall_seconds": wall, "gauge": gauge, "runs": runs}, f, indent=1)
    print(table(runs, objectives, lags))
    print("gauge: %s" % json.dumps(gauge))
    print("wall time %.0f s" % wall)
    if args.results:
        plots = plot(runs, objectives, lags, args.plots, args.steps)
        write_results(args, runs, objectives, lags, seeds, gauge, wall, plots)
        print("wrote %s and %s" % (args.results, ", ".join(plots)))


BEGIN, END = "<!-- staleness:begin -->", "<!-- staleness:end -->"


def write_results(args, runs, objectives, lags, seeds, gauge, wall, plots):
    """Replaces the generated part of the results page (between its
    markers), keeping the prose around it."""
    delays = gauge["delays"]
    lines = [BEGIN,
             "Generated by `python3 bench/staleness_experiment.py --steps %d --seeds %s --lags %s "
             "--task %s --lr %g --group %d --prompts %d --vocab %d --layers %d --jobs %d`: %d runs, wall time "
             "%.0f minutes on this machine." % (
                 args.steps, args.seeds, args.lags, args.task, args.lr, args.group, args.prompts,
                 args.vocab, args.layers, args.jobs, len(runs), wall / 60),
             "",
             "Mean ± standard deviation over seeds %s; final = the last 20 steps' samples; "
             "greedy accuracy, mean@8 and pass@8 on the task's held-out prompts after the last step." % (
                 ", ".join(str(s) for s in seeds)),
             "",
             table(runs, objectives, lags),
             "",
             "The learner's collapse gauge on the same rewards: %d collapsed runs, delay from the "
             "collapse to the gauge %s steps (median %s), %d collapses never flagged, %d flagged "
             "before the 20-step mean crossed half its peak; %d of %d runs without a collapse had "
             "the gauge on (%d steps in all)." % (
                 gauge["collapsed_runs"], sorted(delays) if delays else "-",
                 statistics.median(delays) if delays else "-", gauge["missed"],
                 gauge["fired_before_collapse"], gauge["false_fire_runs"], gauge["healthy_runs"],
                 gauge["false_fire_steps"]),
             ""]
    for path in plots:
        rel = os.path.relpath(path, os.path.dirname(args.results) or ".")
        lines.append("![%s](%s)" % (os.path.basename(path), rel))
    lines.append(END)
    generated = "\n".join(lines)
    text = open(args.results).read() if os.path.exists(args.results) else "# Results\n\n%s\n%s\n" % (BEGIN, END)
    if BEGIN not in text or END not in text:
        text += "\n%s\n%s\n" % (BEGIN, END)
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(args.results, "w") as f:
        f.write(head + generated + tail)


if __name__ == "__main__":
    main()
