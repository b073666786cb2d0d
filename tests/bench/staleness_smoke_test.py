#!/usr/bin/env python3
"""The staleness experiment's command on a tiny grid: it runs the bench loop
for every (objective, lag, seed), and rewrites only the generated part of a
results page, keeping the prose around it.

    staleness_smoke_test.py <source dir> <build dir> <scratch dir>
"""
import csv
import json
import os
import shutil
import subprocess
import sys


def check_minibatches(build, scratch):
    """--minibatches k: a batch sampled at every k-th step and trained as k
    steps in turn. Each batch's first step trains on samples of the weights
    it holds (the drift is rounding); the later ones on samples their own
    earlier steps have moved away from. A --steps that is no whole number of
    batches is refused before anything runs."""
    tool = os.path.join(build, "bench", "task_learning")
    bad = subprocess.run([tool, "--steps", "4", "--minibatches", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--steps 4 is not a whole number of batches of --minibatches 3" in bad.stderr, \
        bad.stderr
    bad = subprocess.run([tool, "--minibatches", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--minibatches 0 must be >= 1" in bad.stderr, bad.stderr
    path = os.path.join(scratch, "minibatches.csv")
    ok = subprocess.run([tool, "--steps", "6", "--minibatches", "3", "--prompts", "4", "--vocab", "16", "--lr", "0.01",
                         "--csv", path, "--eval_prompts", "8"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    with open(path) as f:
        kl = [float(r["behavior_kl"]) for r in csv.DictReader(f)]
    assert len(kl) == 6, kl
    assert all(abs(kl[i]) < 1e-4 for i in (0, 3)), kl
    assert all(kl[i] > 1e-3 for i in (1, 2, 4, 5)), kl


def main():
    source, build, scratch = sys.argv[1:4]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    page = os.path.join(scratch, "results.md")
    with open(page, "w") as f:
        f.write("# Results\n\nprose before\n\n<!-- staleness:begin -->\nold table\n"
                "<!-- staleness:end -->\n\nprose after\n")
    cmd = [sys.executable, os.path.join(source, "bench", "staleness_experiment.py"),
           "--build_dir", build, "--steps", "30", "--seeds", "0,1", "--lags", "0,3",
           "--objectives", "naive,asympo_stable", "--jobs", "2",
           "--out", os.path.join(scratch, "runs"), "--results", page,
           "--plots", os.path.join(scratch, "plots")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    sys.stdout.write(out.stdout + out.stderr)
    assert out.returncode == 0, "exit %d" % out.returncode
    text = open(page).read()
    assert "prose before" in text and "prose after" in text, text
    assert "old table" not in text, text
    assert text.count("<!-- staleness:begin -->") == 1 and text.count("<!-- staleness:end -->") == 1
    for objective in ("naive", "asympo_stable"):
        for lag in (0, 3):
            assert "| `%s` | %d |" % (objective, lag) in text, (objective, lag, text)
    assert "8 runs" in text, text
    # Each run's per-step rows: 30 steps, with the loss diagnostics.
    rows = open(os.path.join(scratch, "runs", "asympo_stable_lag3_seed1.csv")).read().splitlines()
    assert len(rows) == 31, len(rows)
    for column in ("reward", "naive_ratio", "clip_low", "collapse_suspected"):
        assert column in rows[0].split(","), rows[0]
    # A misspelt option of the bench loop is refused, not ignored.
    bad = subprocess.run([os.path.join(build, "bench", "task_learning"), "--setps", "3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument '--setps'" in bad.stderr, bad.stderr
    check_minibatches(build, scratch)
    # --eval_json: asympo-eval's report, with a row per held-out prompt.
    report_path = os.path.join(scratch, "eval.json")
    ok = subprocess.run([os.path.join(build, "bench", "task_learning"), "--steps", "2", "--vocab", "16",
                         "--eval_json", report_path], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    report = json.load(open(report_path))
    assert report["prompts"] == len(report["per_prompt"]) == 69, report["prompts"]
    assert all("greedy_tokens" in row for row in report["per_prompt"])
    print("ok")


if __name__ == "__main__":
    main()
