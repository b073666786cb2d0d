#!/usr/bin/env python3
"""One asynchronous RL run on this machine: one asympo-learner and N
asympo-rollout daemons on loopback, with the built-in tiny model (or a
model directory, --model) and a synthetic task. Prints live progress, then
a summary, and writes the run's logs, a per-step CSV and a reward-curve PNG
into the run directory. At the
end, asympo-eval evaluates the learner's last checkpoint on the task's
held-out prompts (greedy accuracy, mean@k, pass@k; eval.json).

Usually started through deploy/local_run.sh, which installs and builds
first. Ctrl-C stops every process cleanly and still writes the summary.
"""
import argparse
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request


_HANDED_OUT = set()  # the ports free_port gave this process


def free_port():
    """A loopback port nothing listens on now, never one this process was
    given before: the kernel may hand the port just closed out again, and
    two calls in a row (a listen and a metrics port) would then collide."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def without_run_label(sample):
    """'name{a="1",run="x"}' -> 'name{a="1"}', 'name{run="x"}' -> 'name'."""
    sample = re.sub(r'(\{|,)run="(?:[^"\\]|\\.)*"(,?)',
                    lambda m: m.group(1) if m.group(2) or m.group(1) == "{" else "", sample)
    return sample.replace("{}", "")


def scrape(port, timeout=1):
    """Returns {metric{labels}: value} from a /metrics endpoint, or None; the
    run label, the same on every series of one daemon, is left out."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[without_run_label(name)] = float(value)
        except ValueError:
            pass
    return out


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


class Run:
    def __init__(self, args):
        self.args = args
        self.procs = []  # (name, Popen, log file)
        self.stopping = False

    def start(self, name, cmd):
        log = open(os.path.join(self.args.out, name + ".log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((name, p, log))
        return p

    def stop_all(self, timeout=20):
        """SIGTERM to the rollouts, then the learner (it checkpoints), then
        SIGKILL whatever is still running after `timeout` seconds."""
        for name, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + timeout
        for name, p, log in self.procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                print("%s did not stop in %d s; killing it" % (name, timeout))
                p.kill()
                p.wait()
            log.close()


def read_log(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def daemon_error(log_path):
    """The last error a daemon wrote to its log: its own message when it
    refused to start ("asympo-learner: ...") or glog's last E/F line."""
    for line in reversed(read_log(log_path).splitlines()):
        if line.startswith("asympo-"):
            return line
        if re.match(r"[EF]\d{8} ", line):
            return line.split("] ", 1)[-1]
    return ""


def exit_report(name, returncode, out):
    log = os.path.join(out, name + ".log")
    error = daemon_error(log)
    detail = ": " + error if error else ""
    return "%s exited with status %d%s (see %s)" % (name, returncode, detail, log)


def tally_after_stop(out, rollouts):
    """Groups the run generated but did not train, from the daemons' own
    lines at exit: each rollout's generated minus accepted (what the
    learner refused or the rollout dropped or could not send), of which
    unsent at its stop; and the groups left in the learner's queue."""
    lost = unsent = queued = 0
    for i in range(rollouts):
        text = read_log(os.path.join(out, "rollout-%d.log" % i))
        m = re.findall(r"stopped: (\d+) groups generated, (\d+) accepted", text)
        if m:
            lost += int(m[-1][0]) - int(m[-1][1])
        unsent += sum(int(x) for x in re.findall(r"(\d+) generated groups were not sent", text))
    text = read_log(os.path.join(out, "learner.log"))
    m = re.findall(r"(\d+) queued groups were left untrained", text)
    if m:
        queued = int(m[-1])
    return lost, unsent, queued


def write_prometheus_targets(folder, run_name, learner_port, rollout_ports):
    """Writes the run's metrics endpoints as a Prometheus file_sd file,
    <folder>/<run_name>.json (deploy/prometheus/prometheus.yml reads
    runs/prometheus_targets/*.json); returns its path."""
    labels = {"run": run_name}
    groups = [{"targets": ["127.0.0.1:%d" % learner_port], "labels": dict(labels, job="asympo-learner")},
              {"targets": ["127.0.0.1:%d" % p for p in rollout_ports],
               "labels": dict(labels, job="asympo-rollout")}]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, run_name.replace("/", "_") + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(groups, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


# Every numeric option's range, shown by --help and checked (exit 2).
RANGES = {"max_steps": (0, 10**9), "minutes": (0.01, 10**6), "rollouts": (0, 64),
          "learner_ranks": (1, 16), "vocab": (2, 1 << 20), "lr": (0, 1),
          "group_size": (2, 4096), "prompts_per_step": (1, 65536), "temperature": (0, 100),
          "queue_capacity": (1, 1 << 24), "seed": (0, 2**63 - 1), "interval": (0.1, 3600),
          "eval_k": (0, 65536), "check_greedy": (0, 1), "check_rise": (-1, 1)}


def range_text(lo, hi):
    return "%s to %s" % tuple(str(x) if isinstance(x, int) else "%g" % x for x in (lo, hi))


def add_run_flags(ap):
    """Where the run finds its binaries and writes, and how long it lasts."""
    ap.add_argument("--build_dir", default="build", help="where asympo-learner and asympo-rollout were built")
    ap.add_argument("--out", default="", help="run directory (default runs/<date-time>)")
    ap.add_argument("--run_name", default="",
                    help="the run label of every metric series (default: local-<run directory name>)")
    ap.add_argument("--prometheus_targets", default=os.path.join("runs", "prometheus_targets"),
                    help="folder for the run's Prometheus file_sd targets, <run_name>.json, "
                         "removed at the end (deploy/prometheus/prometheus.yml reads it)")
    ap.add_argument("--max_steps", type=int, default=4000,
                    help="learner steps to train (0: train until --minutes runs out)")
    ap.add_argument("--minutes", type=float, default=9.0,
                    help="the longest the run trains, wall clock (it stops at whichever comes first)")
    ap.add_argument("--rollouts", type=int, default=2, help="rollout daemons")
    ap.add_argument("--learner_ranks", type=int, default=1,
                    help="data-parallel learner ranks (Gloo on loopback; rank 0 serves the rollouts)")


def add_training_flags(ap):
    """What is learned and how: task, objective, model and the sampling and
    training settings both daemons share."""
    ap.add_argument("--task", default="copy", help="built-in task (asympo-rollout --list_tasks)")
    # asympo_stable at lr 1e-4: asympo's 1/S_g weighting puts each update on
    # the confident responses, and at 5e-4 the tiny policy turned
    # deterministic before it learned to copy (docs/tasks.md, "Why the demo
    # stalled").
    ap.add_argument("--objective", default="asympo_stable", help="naive, spo, asympo, asympo_stable, grpo, gpg")
    ap.add_argument("--model", default="tiny",
                    help="both daemons' --model: tiny (the built-in model, --vocab ids) or a Hugging "
                         "Face model directory (config.json + safetensors) to start from, such as a "
                         "base made by bench/task_learning --save_model")
    ap.add_argument("--vocab", type=int, default=16,
                    help="vocabulary of the built-in tiny model (copy needs 8 + 4 ids, add 22)")
    ap.add_argument("--lr", type=float, default=1e-4)
    # A constant lr 1e-4 lets a policy that has learned copy drift off it
    # late in the run; decaying to 0.1x over the run holds it (docs/tasks.md).
    ap.add_argument("--lr_schedule", choices=("cosine", "constant"), default="cosine",
                    help="cosine: decay lr to 0.1x over --max_steps steps; constant: keep it")
    ap.add_argument("--group_size", type=int, default=16)
    ap.add_argument("--prompts_per_step", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.3,
                    help="rollout sampling temperature (1.3 keeps every symbol in play; docs/tasks.md)")
    ap.add_argument("--batching", choices=("continuous", "static"), default="continuous",
                    help="the rollouts' --batching: continuous (slots refilled as responses finish, "
                         "prompts_per_step / 2 x group_size of them) or static batches")
    ap.add_argument("--weight_update", choices=("inflight", "between_batches"), default="inflight",
                    help="the rollouts' --weight_update (continuous batching)")
    ap.add_argument("--queue_capacity", type=int, default=32, help="K, in prompt groups (bounds staleness)")
    ap.add_argument("--seed", type=int, default=1)


def add_daemon_flags(ap):
    """Flags handed through to the daemons, and where they run."""
    ap.add_argument("--learner_arg", action="append", default=[], metavar="--FLAG=VALUE",
                    help="one more asympo-learner flag, passed as is and checked by the learner "
                         "(repeatable; e.g. --learner_arg=--lr_schedule=cosine)")
    ap.add_argument("--rollout_arg", action="append", default=[], metavar="--FLAG=VALUE",
                    help="one more asympo-rollout flag for every rollout, passed as is after "
                         "local_run's own (so it overrides them) and checked by the daemon "
                         "(repeatable; e.g. --rollout_arg=--max_running_sequences=16)")
    ap.add_argument("--device", default="cpu", help="both daemons' --device: cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default="float32",
                    help="dtype of the weights rollouts sample with (both daemons' --dtype)")


def add_report_flags(ap):
    """Progress lines, the evaluation at the end and the checks on it."""
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between progress lines")
    ap.add_argument("--eval_k", type=int, default=8,
                    help="samples per held-out prompt for asympo-eval's mean@k and pass@k (0: greedy only)")
    ap.add_argument("--no_eval", action="store_true", help="skip asympo-eval at the end")
    ap.add_argument("--check_greedy", type=float, default=None,
                    help="exit 1 unless asympo-eval's held-out greedy accuracy reaches this")
    ap.add_argument("--check_rise", type=float, default=None,
                    help="exit 1 unless the last 20 steps' mean reward exceeds the first 20's by this much")


def parse_args():
    """The command line, checked: a flag out of its range or inconsistent
    with another ends the launcher (exit 2) before any daemon starts."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(ap)
    add_training_flags(ap)
    add_daemon_flags(ap)
    add_report_flags(ap)
    for action in ap._actions:
        if action.dest in RANGES:
            action.help = (action.help or "") + " (range %s)" % range_text(*RANGES[action.dest])
    args = ap.parse_args()
    for name, (lo, hi) in RANGES.items():
        value = getattr(args, name)
        if value is not None and not lo <= value <= hi:  # also refuses nan
            ap.error("--%s %s: expected %s" % (name, value, range_text(lo, hi)))
    for name in ("learner_arg", "rollout_arg"):
        for a in getattr(args, name):
            if not a.startswith("--") or "=" not in a:
                ap.error("--%s %r: expected one %s flag as --FLAG=VALUE" % (name, a, name.split("_")[0]))
    if args.model != "tiny" and not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error("--model %s: expected tiny or a model directory with config.json" % args.model)
    if args.lr_schedule == "cosine" and args.max_steps == 0:
        ap.error("--lr_schedule cosine decays over --max_steps steps; give --max_steps, or --lr_schedule constant")
    return args


def prepare(args):
    """Finds the binaries (exits when one is missing), creates the run
    directory and settles --out and --run_name; a steps.csv left there by an
    earlier run is removed, as the learner appends to it. Returns the
    learner, rollout and eval binaries and the steps.csv path."""
    learner_bin = os.path.join(args.build_dir, "learner_server", "asympo-learner")
    rollout_bin = os.path.join(args.build_dir, "rollout_server", "asympo-rollout")
    eval_bin = os.path.join(args.build_dir, "rollout_server", "asympo-eval")
    for b in (learner_bin, rollout_bin) + (() if args.no_eval else (eval_bin,)):
        if not os.access(b, os.X_OK):
            sys.exit("local_run: %s not found; build first (deploy/local_run.sh does)" % b)
    if not args.out:
        args.out = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(args.out, exist_ok=True)
    if not args.run_name:
        args.run_name = "local-" + re.sub(r"[^A-Za-z0-9._:@/+-]", "_",
                                          os.path.basename(os.path.normpath(args.out)))[:100]
    steps_csv = os.path.join(args.out, "steps.csv")
    if os.path.exists(steps_csv):
        os.remove(steps_csv)
    return learner_bin, rollout_bin, eval_bin, steps_csv


def catch_signals():
    """SIGINT and SIGTERM only end the progress loop, so that every process
    is stopped and the summary still written; returns the list each signal
    is appended to."""
    interrupted = []

    def on_signal(sig, frame):
        interrupted.append(sig)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return interrupted


def learner_command(args, learner_bin, port, learner_metrics, model, dist, steps_csv):
    """asympo-learner's command line, without --dist_rank."""
    schedule = (["--lr_schedule=cosine", "--total_steps=%d" % args.max_steps]
                if args.lr_schedule == "cosine" else ["--lr_schedule=constant"])
    return [
        learner_bin, "--listen=127.0.0.1:%d" % port, "--metrics_address=127.0.0.1:%d" % learner_metrics,
        "--seed=%d" % args.seed, "--threads=1"] + model + [
        "--device=" + args.device, "--dtype=" + args.dtype, "--objective=" + args.objective,
        "--lr=%g" % args.lr, "--prompts_per_step=%d" % args.prompts_per_step,
        "--queue_capacity=%d" % args.queue_capacity, "--max_groups_per_batch=%d" % min(16, args.queue_capacity),
        "--max_group_size=%d" % max(args.group_size, 2),
        # The tiny model's context (512 positions) bounds a sequence: the
        # learner's memory plan (docs/operations.md, "Memory plan") then
        # needs 1.8 GiB, not the 10.5 GiB of the defaults' 8k-token rows,
        # and a laptop of 8 GB starts it.
        "--max_prompt_tokens=512", "--max_response_tokens=512",
        "--step_csv=" + steps_csv, "--checkpoint_dir=" + os.path.join(args.out, "checkpoints"),
        "--checkpoint_every=200", "--max_steps=%d" % args.max_steps,
        "--run_name=" + args.run_name] + schedule + dist + args.learner_arg


def rollout_command(args, rollout_bin, i, port, metrics_port, model):
    """Rollout daemon i's command line; --rollout_arg comes last, so that it
    overrides local_run's own flags."""
    return [
        rollout_bin, "--learner=127.0.0.1:%d" % port, "--id=rollout-%d" % i,
        "--metrics_address=127.0.0.1:%d" % metrics_port, "--run_name=" + args.run_name,
        "--threads=1"] + model + [
        "--device=" + args.device, "--dtype=" + args.dtype,
        "--seed=%d" % (1000 * args.seed + i), "--task=" + args.task,
        "--group_size=%d" % args.group_size, "--temperature=%g" % args.temperature,
        "--batching=" + args.batching, "--weight_update=" + args.weight_update,
        "--prompts_per_generation=%d" % max(1, args.prompts_per_step // 2),
        "--max_running_sequences=%d" % (max(1, args.prompts_per_step // 2) * args.group_size),
        "--max_groups_per_batch=%d" % min(16, args.queue_capacity),
        "--max_buffered_groups=%d" % max(args.prompts_per_step, 16)] + args.rollout_arg


def start_daemons(run, args, learner_bin, rollout_bin, steps_csv):
    """Starts the learner (rank 0 first, so that run.procs[0] is the one
    the rollouts talk to), its other ranks and the rollouts, each on free
    loopback ports. Returns the learner's port, its metrics port and the
    rollouts' metrics ports."""
    port, learner_metrics = free_port(), free_port()
    model = (["--model=tiny", "--tiny_vocab_size=%d" % args.vocab] if args.model == "tiny"
             else ["--model=" + args.model])
    rollout_metrics = [free_port() for _ in range(args.rollouts)]
    dist = []
    if args.learner_ranks > 1:
        dist = ["--dist_world_size=%d" % args.learner_ranks, "--dist_master_addr=127.0.0.1",
                "--dist_master_port=%d" % free_port(), "--dist_insecure", "--dist_timeout=120s"]
    learner_cmd = learner_command(args, learner_bin, port, learner_metrics, model, dist, steps_csv)
    run.start("learner", learner_cmd + (["--dist_rank=0"] if dist else []))
    # Ranks 1.. only train the share of each step rank 0 sends them.
    for r in range(1, args.learner_ranks):
        run.start("learner-rank%d" % r, learner_cmd + ["--dist_rank=%d" % r])
    for i in range(args.rollouts):
        run.start("rollout-%d" % i, rollout_command(args, rollout_bin, i, port, rollout_metrics[i], model))
    return port, learner_metrics, rollout_metrics


def announce(args, port, learner_metrics, rollout_metrics):
    """Says where the run is and writes its Prometheus targets; prints the
    progress table's header. Returns the targets file."""
    print("local_run: learner on 127.0.0.1:%d%s, %d rollouts, task %s, objective %s; logs and results in %s"
          % (port, " (%d data-parallel ranks)" % args.learner_ranks if args.learner_ranks > 1 else "",
             args.rollouts, args.task, args.objective, args.out))
    targets = write_prometheus_targets(args.prometheus_targets, args.run_name, learner_metrics, rollout_metrics)
    print("local_run: metrics at http://127.0.0.1:%d/metrics (learner) and ports %s (rollouts), "
          "run=%s; Prometheus targets in %s; Ctrl-C stops"
          % (learner_metrics, ",".join(map(str, rollout_metrics)), args.run_name, targets))
    print("%7s %6s %7s %8s %8s %9s %7s %9s %s" % ("time", "step", "version", "reward", "accuracy",
                                                 "tokens/s", "queue", "staleness", "versions in use"))
    return targets


def progress_row(elapsed, lm, rms, last):
    """One progress line's figures from the learner's (lm) and the rollouts'
    (rms) metrics; the rollouts' reward and accuracy are over the responses
    since the previous line, whose running totals `last` holds (updated)."""
    responses = sum(m.get("asympo_rollout_responses_total", 0) for m in rms)
    correct = sum(m.get("asympo_rollout_correct_responses_total", 0) for m in rms)
    reward = sum(m.get("asympo_rollout_reward_sum_total", 0) for m in rms)
    dn = responses - last["responses"]
    acc = (correct - last["correct"]) / dn if dn > 0 else float("nan")
    rwd = (reward - last["reward"]) / dn if dn > 0 else float("nan")
    last.update(responses=responses, correct=correct, reward=reward)
    versions = sorted({int(m["asympo_rollout_weight_version"]) for m in rms if "asympo_rollout_weight_version" in m})
    sc = lm.get("asympo_learner_staleness_versions_count", 0)
    stale = lm.get("asympo_learner_staleness_versions_sum", 0) / sc if sc else float("nan")
    return {
        "time_s": round(elapsed, 1), "step": int(lm.get("asympo_learner_steps_total", 0)),
        "version": int(lm.get("asympo_learner_version", 0)),
        "learner_reward_ema": lm.get("asympo_learner_reward_ema", float("nan")),
        "rollout_reward": rwd, "rollout_accuracy": acc,
        "tokens_per_s": lm.get("asympo_learner_tokens_per_second", 0),
        "queue_depth": int(lm.get("asympo_learner_queue_depth_groups", 0)),
        "staleness_mean": stale, "versions_in_use": " ".join(map(str, versions)),
    }


def watch(run, args, interrupted, start, learner_metrics, rollout_metrics):
    """Prints a progress line every --interval seconds until a signal, a
    daemon's failure, the learner's end or --minutes. Returns the progress
    rows, the learner's last metrics and the failure's report (or None)."""
    progress = []
    last = {"responses": 0.0, "correct": 0.0, "reward": 0.0}
    last_learner = {}
    next_print = start + args.interval
    failed = None
    while True:
        time.sleep(0.2)
        now = time.time()
        for name, p, _ in run.procs:
            if p.poll() is not None and not (name.startswith("learner") and args.max_steps and p.returncode == 0):
                failed = exit_report(name, p.returncode, args.out)
        learner_done = run.procs[0][1].poll() is not None
        if interrupted or failed or learner_done or now - start >= args.minutes * 60:
            break
        if now < next_print:
            continue
        next_print += args.interval
        lm = scrape(learner_metrics) or {}
        last_learner = lm or last_learner  # the learner exits after --max_steps
        rms = [scrape(p) or {} for p in rollout_metrics]
        row = progress_row(now - start, lm, rms, last)
        progress.append(row)
        print("%6.0fs %6d %7d %8.3f %8.3f %9.0f %3d/%-3d %9.2f %s" % (
            row["time_s"], row["step"], row["version"], row["learner_reward_ema"], row["rollout_accuracy"],
            row["tokens_per_s"], row["queue_depth"], args.queue_capacity, row["staleness_mean"],
            row["versions_in_use"].replace(" ", ",") or "-"), flush=True)
    return progress, last_learner, failed


def stop_run(run, args, interrupted, targets, failed, learner_metrics, rollout_metrics, last_learner):
    """Takes the daemons' last metrics, stops every process and removes the
    run's Prometheus targets. Returns the rollouts' and the learner's final
    metrics and the first failure, now including a daemon that exited
    badly at the stop."""
    if interrupted:
        print("local_run: interrupted; stopping every process")
    final_rollout = [scrape(p) or {} for p in rollout_metrics]
    final_learner = scrape(learner_metrics) or last_learner
    run.stop_all()
    try:
        os.remove(targets)  # ended: no longer a target (nor a down one)
    except FileNotFoundError:
        pass  # an earlier run of the same --run_name, stopping, removed it
    for name, p, _ in run.procs:
        if p.returncode not in (0, -signal.SIGTERM) and not failed:
            failed = exit_report(name, p.returncode, args.out)
    return final_rollout, final_learner, failed


def write_progress_csv(path, progress):
    with open(path, "w", newline="") as f:
        if progress:
            w = csv.DictWriter(f, fieldnames=list(progress[0].keys()))
            w.writeheader()
            w.writerows(progress)


def read_steps(steps_csv):
    """The learner's per-step rows, none when it wrote no steps.csv."""
    if not os.path.exists(steps_csv):
        return []
    with open(steps_csv) as f:
        return list(csv.DictReader(f))


def print_policy_lag(args, final_learner):
    """The policy lag line of the summary, also written to policy_lag.json;
    nothing before the learner observed any."""
    lag = policy_lag(final_learner)
    if lag is None:
        return
    print("  policy lag               mean %.2f, p90 %s versions (%d groups; --weight_update=%s)"
          % (lag["mean"], lag["p90"], lag["count"], args.weight_update))
    with open(os.path.join(args.out, "policy_lag.json"), "w") as f:
        json.dump(dict(lag, batching=args.batching, weight_update=args.weight_update), f, indent=1)


def summarize(args, start, steps_csv, eval_bin, progress, final_rollout, final_learner, interrupted, failed):
    """Writes progress.csv, runs asympo-eval, draws the reward curve and
    prints the summary. Returns the evaluation (or None) and the mean
    reward of the first and of the last 20 steps."""
    write_progress_csv(os.path.join(args.out, "progress.csv"), progress)
    steps = read_steps(steps_csv)
    rewards = [float(r["reward_mean"]) for r in steps]
    first, last20 = mean(rewards[:20]), mean(rewards[-20:])
    evaluation = None if args.no_eval else evaluate(eval_bin, args)
    plot = os.path.join(args.out, "reward.png")
    plotted = make_plot(steps, progress, plot, args, evaluation)
    responses = sum(m.get("asympo_rollout_responses_total", 0) for m in final_rollout)
    correct = sum(m.get("asympo_rollout_correct_responses_total", 0) for m in final_rollout)
    lost, unsent, queued = tally_after_stop(args.out, args.rollouts)
    accs = [r["rollout_accuracy"] for r in progress if r["rollout_accuracy"] == r["rollout_accuracy"]]
    print()
    print("summary")
    print("  steps trained            %d in %.0f s (task %s, objective %s)" % (len(steps), time.time() - start, args.task, args.objective))
    if args.max_steps and len(steps) < args.max_steps and not interrupted and not failed:
        print("  stopped by --minutes %g before --max_steps %d%s" % (
            args.minutes, args.max_steps, "; the lr had not finished decaying" if args.lr_schedule == "cosine" else ""))
    print("  reward, first 20 steps   %.3f" % first)
    print("  reward, last 20 steps    %.3f" % last20)
    if accs:
        print("  accuracy, first interval %.3f   last interval %.3f" % (accs[0], accs[-1]))
    print_policy_lag(args, final_learner)
    print("  responses sampled        %d (%.1f%% exact)" % (responses, 100 * correct / responses if responses else 0))
    print("  groups not trained       %d refused, dropped or unsent by the rollouts "
          "(%d unsent at the rollouts' stop); %d left in the learner's queue"
          % (lost, unsent, queued))
    if evaluation is not None:
        print("  held-out (asympo-eval)   %s" % evaluation["line"])
        print("  evaluation report        %s" % os.path.join(args.out, "eval.json"))
    print("  per-step CSV             %s" % steps_csv)
    print("  progress CSV             %s" % os.path.join(args.out, "progress.csv"))
    print("  reward curve             %s" % (plot if plotted else "(not drawn: python3-matplotlib missing)"))
    print("  logs                     %s/{learner,rollout-*}.log" % args.out)
    return evaluation, first, last20


def exit_status(args, failed, evaluation, first, last20):
    """1 when a daemon failed or a --check_* is not met (said why), else 0."""
    if failed:
        print("local_run: " + failed)
        return 1
    if args.check_greedy is not None:
        greedy = evaluation["report"]["greedy_accuracy"] if evaluation else float("nan")
        if not greedy >= args.check_greedy:
            print("local_run: held-out greedy accuracy %.3f is below %.3f" % (greedy, args.check_greedy))
            return 1
    if args.check_rise is not None and not (last20 > first + args.check_rise):
        print("local_run: reward did not rise by %.3f (first %.3f, last %.3f)" % (args.check_rise, first, last20))
        return 1
    return 0


def main():
    args = parse_args()
    learner_bin, rollout_bin, eval_bin, steps_csv = prepare(args)
    run = Run(args)
    interrupted = catch_signals()
    port, learner_metrics, rollout_metrics = start_daemons(run, args, learner_bin, rollout_bin, steps_csv)
    targets = announce(args, port, learner_metrics, rollout_metrics)
    start = time.time()
    progress, last_learner, failed = watch(run, args, interrupted, start, learner_metrics, rollout_metrics)
    final_rollout, final_learner, failed = stop_run(run, args, interrupted, targets, failed,
                                                    learner_metrics, rollout_metrics, last_learner)
    evaluation, first, last20 = summarize(args, start, steps_csv, eval_bin, progress, final_rollout,
                                          final_learner, interrupted, failed)
    return exit_status(args, failed, evaluation, first, last20)


def policy_lag(metrics):
    """Mean and p90 of the learner's asympo_learner_policy_lag histogram (the
    training version minus the version that sampled a group's first token),
    or None before any observation. The p90 is the upper bound of the
    bucket that holds it."""
    count = metrics.get("asympo_learner_policy_lag_count", 0)
    if not count:
        return None
    buckets = []
    for key, value in metrics.items():
        m = re.match(r'asympo_learner_policy_lag_bucket\{.*le="([^"]+)".*\}$', key)
        if m:
            buckets.append((float(m.group(1)), value))
    buckets.sort()
    p90 = next((le for le, c in buckets if c >= 0.9 * count), float("inf"))
    return {"mean": metrics.get("asympo_learner_policy_lag_sum", 0) / count,
            "p90": "%g" % p90, "count": int(count)}


def evaluate(eval_bin, args):
    """asympo-eval on the newest checkpoint: {"report": the JSON, "line": a
    summary}, or None (said why) when there is none or it fails."""
    checkpoints = os.path.join(args.out, "checkpoints")
    if not os.path.isdir(checkpoints):
        print("local_run: no checkpoint to evaluate")
        return None
    out = os.path.join(args.out, "eval.json")
    cmd = [eval_bin, "--checkpoint=" + checkpoints, "--task=" + args.task, "--k=%d" % args.eval_k,
           "--temperature=%g" % args.temperature, "--output=" + out, "--threads=1"]
    with open(os.path.join(args.out, "eval.log"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if rc != 0 or not os.path.exists(out):
        print("local_run: asympo-eval failed (status %d, see %s)" % (rc, os.path.join(args.out, "eval.log")))
        return None
    import json
    with open(out) as f:
        r = json.load(f)
    line = "greedy accuracy %.3f, mean@%d %.3f, pass@%d %.3f, mean length %.2f (%d prompts)" % (
        r["greedy_accuracy"], r["k"], r["mean_at_k"], r["k"], r["pass_at_k"],
        r["greedy_mean_length"], r["prompts"])
    return {"report": r, "line": line}


def make_plot(steps, progress, path, args, evaluation=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    if steps:
        x = [int(r["step"]) for r in steps]
        y = [float(r["reward_mean"]) for r in steps]
        ax.plot(x, y, color="#9ecae1", linewidth=0.8, label="reward per step")
        k = 20
        ma = [mean(y[max(0, i - k + 1):i + 1]) for i in range(len(y))]
        ax.plot(x, ma, color="#08519c", linewidth=2, label="reward, %d-step mean" % k)
    if progress:
        ax.plot([r["step"] for r in progress], [r["rollout_accuracy"] for r in progress], color="#d94801",
                linewidth=1.5, linestyle="--", label="exact-match accuracy (rollouts)")
    if evaluation is not None and steps:
        r = evaluation["report"]
        x = int(steps[-1]["step"])
        ax.scatter([x], [r["greedy_accuracy"]], color="#238b45", marker="*", s=160, zorder=5,
                   label="held-out greedy accuracy %.2f (asympo-eval)" % r["greedy_accuracy"])
        if r["k"] > 0:
            ax.scatter([x], [r["mean_at_k"]], color="#74c476", marker="o", s=50, zorder=5,
                       label="held-out mean@%d %.2f" % (r["k"], r["mean_at_k"]))
    ax.set_xlabel("learner step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("ASymPO-RL local run: task %s, objective %s, %d rollouts" % (args.task, args.objective, args.rollouts))
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(main())
