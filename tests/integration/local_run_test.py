"""deploy/local_run.py as a user starts it, cut short: a learner, two rollout
daemons and asympo-eval at the end. Checks that the launcher refuses bad
flags by name, that the run stops at --max_steps, that the default cosine
schedule reaches the learner (lr decays to 0.1x at the last step), that
the summary and eval.json are written, and that a run with two
data-parallel learner ranks trains.

    python3 local_run_test.py BUILD_DIR WORK_DIR
Exit 0 on success, 1 on a failed check.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local_run.py")


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        raise SystemExit(1)
    print("ok:", what)


def launch(build, *flags, timeout=240):
    return subprocess.run([sys.executable, LAUNCHER, "--build_dir", build] + list(flags),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def refused(build, work):
    cases = [
        (["--learner_arg=lr=1"], "--learner_arg 'lr=1'"),
        (["--rollout_arg=slots"], "--rollout_arg 'slots'"),
        (["--lr_schedule", "cosine", "--max_steps", "0"], "--lr_schedule cosine decays over --max_steps"),
        (["--max_steps", "-3"], "--max_steps -3"),
        (["--minutes", "0"], "--minutes 0"),
        (["--lr_schedule", "linear"], "invalid choice: 'linear'"),
        (["--learner_ranks", "0"], "--learner_ranks 0"),
        (["--model", work], "--model %s: expected tiny or a model directory with config.json" % work),
    ]
    for flags, message in cases:
        r = launch(build, "--out", os.path.join(work, "refused"), *flags, timeout=30)
        check(r.returncode == 2 and message in r.stdout,
              "%s is refused naming it (exit %d: %s)" % (" ".join(flags), r.returncode, r.stdout.strip().splitlines()[-1]))
    check(not os.path.exists(os.path.join(work, "refused", "learner.log")), "a refused run starts no daemon")


def short_run(build, work):
    out = os.path.join(work, "run")
    targets = os.path.join(work, "prometheus_targets")
    r = launch(build, "--out", out, "--max_steps", "40", "--minutes", "3", "--eval_k", "2",
               "--group_size", "4", "--prompts_per_step", "2", "--interval", "1",
               "--prometheus_targets", targets)
    print(r.stdout[-2500:])
    check(r.returncode == 0, "the run exits 0")
    target_file = os.path.join(targets, "local-run.json")
    check("run=local-run; Prometheus targets in %s" % target_file in r.stdout and
          os.path.isdir(targets) and not os.listdir(targets),
          "the run is labelled local-run; its Prometheus targets file was written, then removed")
    for log in ("learner.log", "rollout-0.log"):
        with open(os.path.join(out, log)) as f:
            check('/metrics, run="local-run"' in f.read(), log + ": metrics labelled run=local-run")
    # The learner's memory plan fits a laptop of 8 GB (the tiny model's
    # context bounds a sequence, not the learner's 8k-token defaults).
    with open(os.path.join(out, "learner.log")) as f:
        peak = re.search(r"peak per rank: ([0-9.]+) GiB", f.read())
    check(peak and float(peak.group(1)) < 4, "the learner's memory plan needs %s GiB (< 4)"
          % (peak.group(1) if peak else "?"))
    with open(os.path.join(out, "steps.csv")) as f:
        rows = list(csv.DictReader(f))
    check(len(rows) == 40 and int(rows[-1]["step"]) == 40, "the learner stopped at --max_steps 40 (%d rows)" % len(rows))
    lrs = [float(x["lr"]) for x in rows]
    # Step s trains at the schedule's point (s - 1) / 40: the last is 2% above the floor.
    check(abs(lrs[0] - 1e-4) < 1e-9 and 1e-5 < lrs[-1] < 1.02e-5,
          "the cosine schedule runs from lr 1e-4 down to 1e-5 over the run (%g .. %g)" % (lrs[0], lrs[-1]))
    check(all(a >= b for a, b in zip(lrs, lrs[1:])), "the lr never rises")
    check("steps trained            40" in r.stdout and "stopped by --minutes" not in r.stdout,
          "the summary counts 40 steps and does not claim a time stop")
    with open(os.path.join(out, "eval.json")) as f:
        report = json.load(f)
    check(report["k"] == 2 and 0 <= report["greedy_accuracy"] <= 1 and report["prompts"] > 0,
          "asympo-eval evaluated the last checkpoint (greedy %.3f on %d prompts)"
          % (report["greedy_accuracy"], report["prompts"]))
    check("held-out (asympo-eval)   greedy accuracy" in r.stdout, "the summary shows the held-out result")
    # Groups lost at the end are counted after the daemons stopped: the
    # rollouts' own tallies at exit, which include what they could not send.
    unsent = 0
    for i in range(2):
        with open(os.path.join(out, "rollout-%d.log" % i)) as f:
            found = re.findall(r"(\d+) generated groups were not sent", f.read())
            unsent += sum(int(m) for m in found)
    line = [l for l in r.stdout.splitlines() if l.startswith("  groups not trained")]
    check(line and ("%d unsent at the rollouts' stop" % unsent) in line[0],
          "the summary counts the %d groups unsent at the rollouts' stop (%s)" % (unsent, line))


def failing_learner(build, work):
    # The learner refuses its flags at start: the launcher shows the
    # learner's own message, not only an exit status.
    r = launch(build, "--out", os.path.join(work, "failing"), "--learner_arg=--adam_beta1=2",
               "--no_eval", "--minutes", "1", timeout=90)
    check(r.returncode == 1 and "--adam_beta1=2: expected 0 to 0.999999" in r.stdout,
          "a failing learner's own error is shown (exit %d: %s)"
          % (r.returncode, r.stdout.strip().splitlines()[-1:]))


def two_ranks(build, work):
    out = os.path.join(work, "ranks")
    r = launch(build, "--out", out, "--max_steps", "20", "--minutes", "3", "--no_eval", "--learner_ranks", "2",
               "--group_size", "4", "--prompts_per_step", "4", "--interval", "1")
    print(r.stdout[-1500:])
    check(r.returncode == 0 and "(2 data-parallel ranks)" in r.stdout, "a run with 2 learner ranks exits 0")
    with open(os.path.join(out, "steps.csv")) as f:
        check(len(list(csv.DictReader(f))) == 20, "rank 0 trained 20 steps")
    with open(os.path.join(out, "learner-rank1.log")) as f:
        log = f.read()
    check("rank 1 of 2" in log and "stopped with rank 0 after 20 steps" in log,
          "rank 1 joined and trained its share of all 20 steps")


def model_dir_run(build, work):
    """--model DIR: both daemons and asympo-eval start from a saved model (a
    base made by bench/task_learning --save_model), on task add."""
    model = os.path.join(work, "base")
    subprocess.run([os.path.join(build, "bench", "task_learning"), "--task", "add", "--layers", "1",
                    "--hidden", "32", "--steps", "0", "--base_stats", "0", "--save_model", model],
                   check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=120)
    out = os.path.join(work, "from_model")
    r = launch(build, "--out", out, "--model", model, "--task", "add", "--max_steps", "6",
               "--minutes", "3", "--eval_k", "0", "--group_size", "4", "--prompts_per_step", "2",
               "--lr_schedule", "constant", "--rollouts", "1", "--prometheus_targets",
               os.path.join(work, "prometheus_targets"))
    print(r.stdout[-1500:])
    check(r.returncode == 0 and "steps trained            6" in r.stdout, "a run from --model DIR exits 0 after 6 steps")
    for log in ("learner.log", "rollout-0.log"):
        with open(os.path.join(out, log)) as f:
            check(model in f.read(), log + ": the daemon loaded " + model)
    with open(os.path.join(out, "eval.json")) as f:
        check(json.load(f)["prompts"] > 0, "asympo-eval evaluated the run's checkpoint of that model")


def main():
    build, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    refused(build, work)
    failing_learner(build, work)
    short_run(build, work)
    model_dir_run(build, work)
    two_ranks(build, work)
    print("PASS")


if __name__ == "__main__":
    main()
