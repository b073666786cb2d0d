#!/usr/bin/env python3
"""The paper's three claims on task add (docs/tasks.md), resumable: a base
model made here by supervised training, a learning-rate sweep at lag 0,
then every objective at every lag and seed. Each run writes one result file
(JSON) when it finishes; a run whose file exists is skipped, so a grid
stopped part-way completes when started again. Commit the files as they
land.

    python3 bench/claims_experiment.py [--build_dir build] [--out docs/results/claims]
        [--phase base,sweep,grid,batches,daemons,copy] [--jobs 2] [--steps 400] [--seeds 0,1,2]
        [--lags 0,4,16] [--lrs 3e-5,1e-4,3e-4] [--objectives naive,gpg,grpo,spo,asympo,asympo_stable]
        [--layers 4] [--hidden 128]
        [--batch_objectives grpo,grpo_verl,spo,asympo,asympo_stable] [--batch_lag 4] [--minibatches 16]
        [--daemon_objectives naive,gpg,grpo,spo,asympo] [--daemon_queue 128]
        [--copy_objectives grpo,spo,asympo] [--copy_steps 600]
    python3 bench/claims_report.py   # then: docs/results.md's tables from the files

Layout under --out:
  base/model/          the base model (task_learning --sft_steps ... --save_model)
  base/base.json       its accuracy, S_g range and within-group 1/S_g ratios
  base/eval.json       asympo-eval's report on it (held-out mean@k, greedy, pass@k)
  sweep/OBJ_lrLR_lag0_seedS.json   lag 0, every objective and learning rate
  grid/OBJ_lrLR_lagK_seedS.json
  batches/OBJ_lrLR_lagK_mbM_seedS.json   phase batches: VeRL's batch structure, a batch of
                       M steps' prompts sampled at once (by the weights of K steps
                       before) and trained as M steps in turn; grpo_verl is grpo with
                       std-normalized advantages and the dual clip at 3
  daemons/OBJ_qQ_seedS.json   phase daemons: the same settings through
                       deploy/local_run.py (a learner, two rollout daemons, a
                       queue of Q groups: real staleness), at the shared lr
  copy/OBJ_seedS.json  phase copy: the mechanism's measures on copy (3-5-token
                       responses from random weights, the copy grid's settings)
  runs/NAME.csv, runs/NAME.log  the per-step rows and the logs (not committed)
  csv/NAME.csv.gz      the per-step rows, compressed (committed)
  summary.json         what the files say, cell by cell (and the lr chosen)

With --lr every objective runs at that one rate and there is no sweep
(docs/method.md, "Deciding the paper's claims": 3e-5, seeds 0-9):

    python3 bench/claims_experiment.py --phase grid,batches --lr 3e-5 --seeds 0,1,2,3,4,5,6,7,8,9

The runs go in this order, so that a stopped experiment lacks the least
needed: the claims' four objectives (grpo, spo, asympo, asympo_stable) at
every lag with naive at lag 0 (the noise floor), then phase batches, then
the rest of naive and gpg. A second model size is
another --out with its own base (--layers, --hidden):

    python3 bench/claims_experiment.py --out docs/results/claims-large --layers 8 --hidden 192 \
        --phase base,grid --lr 3e-5 --lags 16,0 --seeds 0,1,2,3,4 --objectives grpo,spo,asympo,asympo_stable

Otherwise the shared learning rate is the one with the best mean@8 for grpo at lag 0
over the seeds (this experiment's rule: the paper gives every method one rate, 2e-6, and describes
no sweep); the grid runs every objective with
it, and with each objective's own best learning rate at lag 0 where that
differs. Per step (runs/*.csv): reward, S_P, S_N, the degenerate-group
fraction, the entropy of the operand orders and, under a lag, the mean
token KL between the weights that sampled and the weights that train.
"""
import argparse
import concurrent.futures
import gzip
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from staleness_experiment import read_rows, run_logged  # noqa: E402  (the same logs and CSVs)

OBJECTIVES = ["naive", "gpg", "grpo", "spo", "asympo", "asympo_stable"]
# The paper's claims are about these four; naive and gpg run after them.
CLAIM_OBJECTIVES = ["grpo", "spo", "asympo", "asympo_stable"]
# Objectives as run, by name: grpo_verl is grpo as VeRL runs it
# (std-normalized advantages, the dual clip at 3).
VARIANTS = {"grpo_verl": ["--objective", "grpo", "--advantage", "mean_std", "--clip_ratio_c", "3"]}
PHASES = ("base", "sweep", "grid", "batches", "daemons", "copy")
# Phase copy: the mechanism on very short responses, with the copy grid's
# settings of docs/results.md (bench/staleness_experiment.py's defaults).
COPY = ["--task", "copy", "--lr", "0.0003", "--group", "16", "--prompts", "8", "--vocab", "16",
        "--layers", "2", "--lag", "0"]
SFT = re.compile(r"^sft done (.*)$", re.M)
BASE = re.compile(r"^base responses=(\d+) S_g median=([\d.]+) p10=([\d.]+) p90=([\d.]+) nats; "
                  r"within-group max/min of 1/S_g median=([\d.]+) p90=([\d.]+); "
                  r"sample accuracy=([\d.]+)$", re.M)
# The base: the smallest model that learns add (docs/tasks.md, "A base model
# for add"), unless --layers and --hidden say otherwise (the second size).
LAYERS, HIDDEN = 4, 128


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build_dir", default="build")
    ap.add_argument("--out", default="docs/results/claims")
    ap.add_argument("--phase", default=",".join(p for p in PHASES if p != "batches"),
                    help="comma-separated: " + ", ".join(PHASES) + " (batches only when named)")
    ap.add_argument("--copy_objectives", default="grpo,spo,asympo",
                    help="phase copy: the objectives whose mechanism is measured on copy")
    ap.add_argument("--copy_steps", type=int, default=600, help="phase copy: steps per run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lags", default="0,4,16")
    ap.add_argument("--lrs", default="3e-5,1e-4,3e-4")
    ap.add_argument("--lr", type=float, default=0.0,
                    help="one learning rate for every objective (docs/method.md, \"Deciding the paper's "
                         "claims\"): no sweep, and phase grid at this rate only (0: the sweep's rule)")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--layers", type=int, default=LAYERS, help="phase base: the model's layers")
    ap.add_argument("--hidden", type=int, default=HIDDEN, help="phase base: the model's width")
    ap.add_argument("--batch_objectives", default="grpo,grpo_verl,spo,asympo,asympo_stable",
                    help="phase batches: the objectives in VeRL's batch structure (grpo_verl: grpo with "
                         "std-normalized advantages and the dual clip at 3)")
    ap.add_argument("--batch_lag", type=int, default=4, help="phase batches: the sampler's lag in steps")
    ap.add_argument("--minibatches", type=int, default=16,
                    help="phase batches: a batch of this many steps' prompts, sampled at once and trained as "
                         "that many steps in turn (the paper's 512 prompts as 16 mini-batch steps)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--eval_prompts_k", type=int, default=8, help="mean@k and pass@k of the final evaluation")
    ap.add_argument("--eval_prompts", type=int, default=0,
                    help="held-out prompts of each run's final evaluation (0: the task's 1000)")
    ap.add_argument("--sft_target", type=float, default=0.4)
    ap.add_argument("--sft_steps", type=int, default=3000)
    ap.add_argument("--daemon_objectives", default="naive,gpg,grpo,spo,asympo",
                    help="phase daemons: one local_run.py run each")
    ap.add_argument("--daemon_queue", type=int, default=128,
                    help="phase daemons: the learner's queue in groups (128 = 16 steps of 8 prompts)")
    args = ap.parse_args(argv)
    args.seeds = [int(x) for x in args.seeds.split(",") if x]
    args.lags = [int(x) for x in args.lags.split(",") if x]
    args.lrs = [float(x) for x in args.lrs.split(",") if x]
    args.objectives = [x for x in args.objectives.split(",") if x]
    args.batch_objectives = [x for x in args.batch_objectives.split(",") if x]
    args.daemon_objectives = [x for x in args.daemon_objectives.split(",") if x]
    args.phase = [x for x in args.phase.split(",") if x]
    args.copy_objectives = [x for x in args.copy_objectives.split(",") if x]
    for flag in ("objectives", "daemon_objectives", "copy_objectives"):
        for o in getattr(args, flag):
            if o not in OBJECTIVES:
                ap.error("--%s: unknown objective %r (%s)" % (flag, o, ", ".join(OBJECTIVES)))
    for o in args.batch_objectives:
        if o not in OBJECTIVES and o not in VARIANTS:
            ap.error("--batch_objectives: unknown objective %r (%s)" % (o, ", ".join(OBJECTIVES + list(VARIANTS))))
    if args.layers < 1 or args.hidden < 4 or args.hidden % 4:
        ap.error("--layers must be positive and --hidden a positive multiple of 4 (4 heads)")
    for p in args.phase:
        if p not in PHASES:
            ap.error("--phase: unknown phase %r (%s)" % (p, ", ".join(PHASES)))
    if "batches" in args.phase and (args.minibatches < 1 or args.steps % args.minibatches or args.batch_lag < 0):
        ap.error("--minibatches must divide --steps (%d) and --batch_lag be >= 0" % args.steps)
    if args.steps < 1 or args.jobs < 1 or not args.seeds or not args.lags or not args.lrs:
        ap.error("--steps and --jobs must be positive; --seeds, --lags and --lrs non-empty")
    if args.lr < 0 or not math.isfinite(args.lr):
        ap.error("--lr must be a finite rate >= 0 (0: the sweep's rule)")
    if args.daemon_queue < 1 or args.copy_steps < 1:
        ap.error("--daemon_queue and --copy_steps must be positive")
    return args


def write_json(path, value):
    """Atomically: a file that exists is a finished run."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def task_learning(args):
    return os.path.join(args.build_dir, "bench", "task_learning")


def make_base(args):
    """The base model and base/base.json, unless they exist."""
    base = os.path.join(args.out, "base")
    result = os.path.join(base, "base.json")
    if os.path.exists(result) and os.path.exists(os.path.join(base, "model", "config.json")):
        return read_json(result)
    os.makedirs(base, exist_ok=True)
    cmd = [task_learning(args), "--task", "add", "--layers", str(args.layers), "--hidden", str(args.hidden),
           "--sft_steps", str(args.sft_steps),
           "--sft_eval_every", "25", "--sft_target", repr(args.sft_target), "--sft_batch", "64",
           "--sft_lr", "1e-3", "--steps", "0", "--save_model", os.path.join(base, "model"),
           "--base_stats", "64", "--group", str(args.group), "--threads", "1", "--seed", "0"]
    start = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("the base model failed (exit %d): %s" % (out.returncode, out.stderr[-2000:]))
    sft = dict(kv.split("=", 1) for kv in SFT.search(out.stdout).group(1).split())
    m = BASE.search(out.stdout)
    value = {"command": " ".join(cmd), "seconds": round(time.time() - start, 1),
             "sft": {k: float(v) for k, v in sft.items()},
             "s_g": {"median": float(m.group(2)), "p10": float(m.group(3)), "p90": float(m.group(4))},
             "inverse_s_ratio": {"median": float(m.group(5)), "p90": float(m.group(6))},
             "sample_accuracy": float(m.group(7)), "responses": int(m.group(1))}
    write_json(result, value)
    return value


def evaluate_base(args):
    """base/eval.json: asympo-eval's report on the base (held-out mean@k,
    greedy accuracy, pass@k), unless it exists: the verdicts judge collapse
    against the base's mean@k."""
    result = os.path.join(args.out, "base", "eval.json")
    if not os.path.exists(result):
        cmd = [os.path.join(args.build_dir, "rollout_server", "asympo-eval"),
               "--model=" + os.path.join(args.out, "base", "model"), "--task=add", "--k=%d" % args.eval_prompts_k,
               "--output=" + result + ".part"]
        if args.eval_prompts:
            cmd.append("--max_prompts=%d" % args.eval_prompts)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError("asympo-eval of the base failed (exit %d): %s" % (out.returncode, out.stderr[-2000:]))
        os.replace(result + ".part", result)
    return read_json(result)


S_G_RANGE = (0.2, 0.6)  # nats: a pretrained model's response NLL (an assumption: the paper states no range)
RATIO_MODERATE = 10.0   # within-group max/min of 1/S_g, median


def base_check(base):
    """Whether the base sits where the paper's claims can hold: its S_g
    median in S_G_RANGE and ASymPO's within-group weights moderate."""
    s_g, ratio = base["s_g"]["median"], base["inverse_s_ratio"]["median"]
    ok_s = S_G_RANGE[0] <= s_g <= S_G_RANGE[1]
    ok_r = ratio < RATIO_MODERATE
    text = ("S_g median %.3f nats (%s %g-%g, the range assumed for a pretrained model: the paper states none); "
            "within-group 1/S_g ratio median %.2f (%s)") % (
        s_g, "within" if ok_s else "OUTSIDE", S_G_RANGE[0], S_G_RANGE[1], ratio,
        "moderate, below %g" % RATIO_MODERATE if ok_r else "NOT moderate: %g or more" % RATIO_MODERATE)
    return ok_s and ok_r, text


def run_name(objective, lr, lag, seed, minibatches=1):
    """OBJ_lrLR_lagK_seedS, with _mbM before the seed in VeRL's batch structure."""
    mb = "_mb%d" % minibatches if minibatches > 1 else ""
    return "%s_lr%g_lag%d%s_seed%d" % (objective, lr, lag, mb, seed)


def objective_flags(objective):
    return VARIANTS.get(objective, ["--objective", objective])


def mean_of(rows, column, begin=0, end=None):
    values = [r[column] for r in rows[begin:end] if not math.isnan(r[column])]
    return statistics.mean(values) if values else float("nan")


def analyse(rows):
    """The paper's collapse: after the first half, the 20-step mean reward
    below half its running peak."""
    rewards = [r["reward"] for r in rows]
    peak, collapse, means = 0.0, None, []
    for i in range(len(rewards)):
        mean20 = statistics.mean(rewards[max(0, i - 19):i + 1])
        means.append(mean20)
        peak = max(peak, mean20)
        if collapse is None and i >= len(rewards) // 2 and peak > 0.1 and mean20 < 0.5 * peak:
            collapse = int(rows[i]["step"])
    return {"peak_reward20": peak, "final_reward20": means[-1] if means else float("nan"),
            "collapse_step": collapse}


def trajectory(rows):
    """The mechanism's measures, the same on every task: at the start (first
    20 steps) and the end (last 50), how many groups carry no signal and how
    sharp the policy is; the degenerate fraction over steps 331-350; and the
    training accuracy (20-step mean) when the mean token NLL first fell below
    1.0 (None when it never did or started below)."""
    out = {}
    for column in ("degenerate_fraction", "mean_nll", "s_pos", "s_neg", "accuracy"):
        out[column] = [mean_of(rows, column, 0, 20), mean_of(rows, column, -50)]
    out["degenerate_350"] = mean_of(rows, "degenerate_fraction", 330, 350) if len(rows) >= 350 else None
    out["nll_below_1"] = None
    if rows and rows[0]["mean_nll"] >= 1.0:
        i = next((i for i, r in enumerate(rows) if r["mean_nll"] < 1.0), None)
        if i is not None:
            out["nll_below_1"] = {"step": int(rows[i]["step"]),
                                  "accuracy20": mean_of(rows, "accuracy", max(0, i - 19), i + 1)}
    return out


def train(cmd, name, csv_path, log_path):
    """staleness_experiment's run_logged, then the per-step rows of csv_path."""
    seconds, final = run_logged(cmd, name, log_path)
    return seconds, final, read_rows(csv_path)


def run_one(args, folder, objective, lr, lag, seed, minibatches=1):
    name = run_name(objective, lr, lag, seed, minibatches)
    result = os.path.join(args.out, folder, name + ".json")
    runs = os.path.join(args.out, "runs")
    csv_path, log_path = os.path.join(runs, name + ".csv"), os.path.join(runs, name + ".log")
    if os.path.exists(result):
        value = read_json(result)
        if "nll_below_1" not in value.get("trajectory", {}) and os.path.exists(csv_path):
            # A result of before the trajectory was kept: derived from its own rows.
            value["trajectory"] = trajectory(read_rows(csv_path))
            write_json(result, value)
        return value
    cmd = [task_learning(args), "--task", "add", "--init_model", os.path.join(args.out, "base", "model"),
           *objective_flags(objective), "--lr", repr(lr), "--lag", str(lag), "--seed", str(seed),
           "--steps", str(args.steps), "--group", str(args.group), "--prompts", str(args.prompts),
           "--eval_k", str(args.eval_prompts_k), "--eval_prompts", str(args.eval_prompts), "--log_every", "50",
           "--csv", csv_path, "--threads", "1", "--base_stats", "0"]
    if minibatches > 1:
        cmd += ["--minibatches", str(minibatches)]
    seconds, final, rows = train(cmd, name, csv_path, log_path)
    keep_csv(args, csv_path, name)
    half = len(rows) // 2
    value = {"objective": objective, "lr": lr, "lag": lag, "seed": seed, "steps": args.steps,
             "minibatches": minibatches,
             "command": " ".join(cmd), "seconds": round(seconds, 1), "eval": final, **analyse(rows),
             "s_pos": mean_of(rows, "s_pos"), "s_neg": mean_of(rows, "s_neg"),
             "degenerate_fraction": mean_of(rows, "degenerate_fraction"),
             "order_entropy_first": mean_of(rows, "order_entropy", 0, 20),
             "order_entropy_last": mean_of(rows, "order_entropy", -20),
             "behavior_kl": mean_of(rows, "behavior_kl", half), "trajectory": trajectory(rows)}
    os.makedirs(os.path.dirname(result), exist_ok=True)
    write_json(result, value)
    return value


def keep_csv(args, csv_path, name):
    """The run's per-step rows, compressed, beside the results (committed:
    the report recomputes collapses and trajectories from them)."""
    os.makedirs(os.path.join(args.out, "csv"), exist_ok=True)
    with open(csv_path, "rb") as src, open(os.path.join(args.out, "csv", name + ".csv.gz.part"), "wb") as raw:
        with gzip.GzipFile(filename=name + ".csv", mode="wb", fileobj=raw, mtime=0) as dst:
            dst.write(src.read())
    os.replace(os.path.join(args.out, "csv", name + ".csv.gz.part"), os.path.join(args.out, "csv", name + ".csv.gz"))


def run_all(args, jobs):
    """Runs (folder, objective, lr, lag, seed) jobs, skipping finished ones.
    The results come back in the jobs' order, whatever order they finish in."""
    done = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_one, args, *job): job for job in jobs}
        for f in concurrent.futures.as_completed(futures):
            value = f.result()
            done[futures[f]] = value
            print("done %s %s: mean@%d %.3f, greedy %.3f, %.0f s" % (
                futures[f][0], run_name(*futures[f][1:]), args.eval_prompts_k,
                value["eval"].get("mean@%d" % args.eval_prompts_k, float("nan")),
                value["eval"].get("greedy_acc", float("nan")), value["seconds"]), flush=True)
    return [done[job] for job in jobs]


def run_copy(args, objective, seed):
    """One copy run at lag 0 (the task of 3-5-token responses, from random
    weights): its final evaluation and the same trajectory as an add run."""
    name = "%s_seed%d" % (objective, seed)
    result = os.path.join(args.out, "copy", name + ".json")
    if os.path.exists(result):
        return read_json(result)
    csv_path = os.path.join(args.out, "runs", "copy_%s.csv" % name)
    log_path = os.path.join(args.out, "runs", "copy_%s.log" % name)
    cmd = [task_learning(args), *COPY, "--steps", str(args.copy_steps), "--objective", objective,
           "--seed", str(seed), "--log_every", "100", "--csv", csv_path, "--threads", "1"]
    seconds, final, rows = train(cmd, "copy " + name, csv_path, log_path)
    value = {"objective": objective, "seed": seed, "task": "copy", "command": " ".join(cmd),
             "seconds": round(seconds, 1), "eval": final, **analyse(rows), "trajectory": trajectory(rows)}
    write_json(result, value)
    return value


def run_daemons(args, objective, lr, seed):
    """One deploy/local_run.py run from the base: real staleness from the
    learner's queue and two rollout daemons. Skipped when its result exists;
    a run folder that finished (eval.json) is read, not run again."""
    name = "%s_q%d_seed%d" % (objective, args.daemon_queue, seed)
    result = os.path.join(args.out, "daemons", name + ".json")
    if os.path.exists(result):
        return read_json(result)
    folder = os.path.join(args.out, "runs", "daemons_" + name)
    here = os.path.dirname(os.path.abspath(__file__))
    flags = ["--build_dir", args.build_dir, "--model", os.path.join(args.out, "base", "model"),
             "--task", "add", "--objective", objective, "--lr", repr(lr), "--lr_schedule", "constant",
             "--temperature", "1.0", "--group_size", str(args.group), "--prompts_per_step", str(args.prompts),
             "--queue_capacity", str(args.daemon_queue), "--max_steps", str(args.steps), "--minutes", "60",
             "--seed", str(seed), "--eval_k", str(args.eval_prompts_k), "--interval", "30", "--out", folder]
    cmd = [sys.executable, os.path.join(here, "..", "deploy", "local_run.py")] + flags
    if not os.path.exists(os.path.join(folder, "eval.json")):
        with open(folder + ".out", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if rc != 0 or not os.path.exists(os.path.join(folder, "eval.json")):
            raise RuntimeError("daemons %s failed (exit %d): see %s.out" % (name, rc, folder))
    rows = [dict(r, reward=r["reward_mean"]) for r in read_rows(os.path.join(folder, "steps.csv"))]
    ev = read_json(os.path.join(folder, "eval.json"))
    # The learner's lag histogram as last scraped (absent when no scrape saw a trained group).
    lag_path = os.path.join(folder, "policy_lag.json")
    lag = read_json(lag_path) if os.path.exists(lag_path) else None
    k = ev["k"]
    value = {"objective": objective, "lr": lr, "seed": seed, "queue": args.daemon_queue, "steps": len(rows),
             "command": " ".join(["python3", "deploy/local_run.py"] + flags),
             "seconds": round(rows[-1]["time_s"], 1) if rows else float("nan"),
             "eval": {"greedy_acc": ev["greedy_accuracy"], "mean@%d" % k: ev["mean_at_k"],
                      "pass@%d" % k: ev["pass_at_k"], "prompts": ev["prompts"]},
             **analyse(rows),
             "policy_lag": {"mean": lag["mean"], "p90": float(lag["p90"])} if lag else None,
             "staleness_mean": mean_of(rows, "staleness_mean"),
             "s_pos": mean_of(rows, "s_pos"), "s_neg": mean_of(rows, "s_neg")}
    write_json(result, value)
    return value


def best_lr(runs, objective, k):
    """The learning rate with the best mean of mean@k over seeds. A tie goes to
    the smaller rate and a rate whose score is NaN never wins, so the choice
    does not depend on the order the runs finished in."""
    by_lr = {}
    for r in runs:
        if r["objective"] == objective:
            by_lr.setdefault(r["lr"], []).append(r["eval"].get("mean@%d" % k, float("nan")))
    scored = {lr: statistics.mean(v) for lr, v in by_lr.items() if v}
    scored = {lr: (v if v == v else float("-inf")) for lr, v in scored.items()}
    return min(scored, key=lambda lr: (-scored[lr], lr)) if scored else None


def main(argv=None):
    args = parse_args(argv)
    for sub in ("base", "sweep", "grid", "batches", "daemons", "copy", "runs"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    # A later invocation with fewer phases keeps what the earlier ones recorded.
    summary_path = os.path.join(args.out, "summary.json")
    summary = read_json(summary_path) if os.path.exists(summary_path) else {}
    summary.update({"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": args.steps})
    start = time.time()
    base = os.path.join(args.out, "base", "base.json")
    if "base" in args.phase or not os.path.exists(base):
        summary["base"] = make_base(args)
        print("base: %s" % json.dumps(summary["base"]["s_g"]), flush=True)
    if os.path.exists(os.path.join(args.out, "base", "model", "config.json")):
        summary["base_eval"] = evaluate_base(args)
    if os.path.exists(base):
        ok, text = base_check(read_json(base))
        summary["base_check"] = {"ok": ok, "text": text}
        print("base check: %s%s" % (text, "" if ok else "; the claims are tested outside the range assumed for a pretrained model"),
              flush=True)
    # grpo first: the shared learning rate is its best.
    order = sorted(args.objectives, key=lambda o: o != "grpo")
    sweep = run_all(args, [("sweep", o, lr, 0, s) for o in order for lr in args.lrs for s in args.seeds]) \
        if {"sweep", "grid", "batches", "daemons"} & set(args.phase) and not args.lr else []
    shared = args.lr or (best_lr(sweep, "grpo", args.eval_prompts_k) if sweep else None)
    own = {} if args.lr else {o: best_lr(sweep, o, args.eval_prompts_k) for o in args.objectives}
    if sweep:
        summary.update({"shared_lr": shared, "own_lr": own, "sweep": sweep})
    grid_jobs = []
    if "grid" in args.phase and shared is not None:
        # Lag 0 at a swept learning rate is a sweep run already.
        def folder(lr, lag):
            return "sweep" if lag == 0 and lr in args.lrs else "grid"
        jobs = {(folder(shared, lag), o, shared, lag, s) for o in args.objectives for lag in args.lags
                for s in args.seeds}
        jobs |= {(folder(own[o], lag), o, own[o], lag, s) for o in args.objectives if own.get(o) is not None
                 for lag in args.lags for s in args.seeds}
        # In --lags' order: the second size runs lag 16 before lag 0.
        grid_jobs = sorted(jobs, key=lambda j: (args.lags.index(j[3]), j[1], j[2], j[4]))
    batch_jobs = []
    if "batches" in args.phase and shared is not None:
        # Seed by seed: a stopped run leaves whole seed sets, each a pair.
        batch_jobs = [("batches", o, shared, args.batch_lag, s, args.minibatches)
                      for s in args.seeds for o in args.batch_objectives]
    # The claims' four objectives first, with naive at lag 0 (the noise
    # floor: grpo - naive), then naive and gpg at the largest lag (claim 1's
    # collapses), then VeRL's batch structure, then the rest of naive and
    # gpg: whatever a stopped run leaves undone is the least needed.
    claim = [j for j in grid_jobs if j[1] in CLAIM_OBJECTIVES or (j[1] == "naive" and j[3] == 0)]
    claim += [j for j in grid_jobs if j not in claim and j[3] == max(args.lags)]
    rest = [j for j in grid_jobs if j not in claim]
    done = dict(zip(claim + batch_jobs + rest, run_all(args, claim + batch_jobs + rest)))
    if grid_jobs and args.lr:
        summary["one_lr"] = {"lr": args.lr, "seeds": args.seeds, "runs": [done[j] for j in grid_jobs]}
    elif grid_jobs:
        summary["grid"] = [done[j] for j in grid_jobs]
    if batch_jobs:
        summary["batches"] = {"lr": shared, "lag": args.batch_lag, "minibatches": args.minibatches,
                              "runs": [done[j] for j in batch_jobs]}
    if "daemons" in args.phase:
        lr = shared if shared is not None else args.lrs[0]
        summary["daemons"] = []
        for o in args.daemon_objectives:  # one at a time: each run is three processes
            value = run_daemons(args, o, lr, args.seeds[0])
            summary["daemons"].append(value)
            print("done daemons %s: mean@%d %.3f, greedy %.3f, staleness %.1f, %.0f s" % (
                o, args.eval_prompts_k, value["eval"].get("mean@%d" % args.eval_prompts_k, float("nan")),
                value["eval"]["greedy_acc"], value["staleness_mean"], value["seconds"]), flush=True)
    if "copy" in args.phase:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            summary["copy"] = list(pool.map(lambda j: run_copy(args, *j),
                                            [(o, s) for o in args.copy_objectives for s in args.seeds]))
        print("done copy: %d runs" % len(summary["copy"]), flush=True)
    summary["seconds_this_invocation"] = round(time.time() - start, 1)
    runs = summary.get("sweep", []) + summary.get("grid", []) + summary.get("one_lr", {}).get("runs", []) + \
        summary.get("batches", {}).get("runs", [])
    summary["seconds_all_runs"] = round(sum(r["seconds"] for r in {id(r): r for r in runs}.values()), 1)
    write_json(summary_path, summary)
    print("summary: %s (shared lr %s)" % (summary_path, shared))


if __name__ == "__main__":
    main()
