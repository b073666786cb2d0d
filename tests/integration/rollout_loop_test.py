"""The whole loop with real processes on loopback: asympo-learner and two
asympo-rollout daemons. Scenarios (one per run, chosen by the first
argument):

  train      versions reach both rollouts, their groups train the learner
  corrupt    snapshots corrupted in transit are refused; the rollouts keep
             their old weights, report the failure, and load the next one
  kill       a rollout killed mid-transfer leaves the learner and the other
             rollout unaffected; restarted, it catches up to the latest version
  restart    the learner restarted from its checkpoint is rejoined by the
             rollouts, which follow its restored version and train on
  idle       a rollout with nothing to send yet (its first snapshot still
             arriving) notices that the learner died and counts its retries

    python3 rollout_loop_test.py SCENARIO LEARNER_BINARY ROLLOUT_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

# The launcher's /metrics scraper and free-port helper.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
import local_run  # noqa: E402

free_port = local_run.free_port


def scrape(port):
    return local_run.scrape(port, timeout=2) or {}


def check(cond, what, quiet=False):
    if not cond:
        print("FAIL:", what)
        raise SystemExit(1)
    if not quiet:
        print("ok:", what)


def wait_for(what, pred, timeout=60, poll=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    check(False, what + " (timed out after %d s)" % timeout)


class Cluster:
    def __init__(self, learner_bin, rollout_bin, work):
        self.learner_bin, self.rollout_bin, self.work = learner_bin, rollout_bin, work
        self.port = free_port()
        self.learner_metrics = free_port()
        self.rollout_metrics = [free_port(), free_port()]
        self.procs = {}
        self.learner_args = []

    def start_learner(self, extra=()):
        self.learner_args = list(extra)
        log = open(os.path.join(self.work, "learner.log"), "a")
        self.procs["learner"] = subprocess.Popen(
            [self.learner_bin, "--listen=127.0.0.1:%d" % self.port,
             "--metrics_address=127.0.0.1:%d" % self.learner_metrics, "--prompts_per_step=2",
             "--queue_capacity=8", "--max_groups_per_batch=8", "--lr=1e-3", "--checkpoint_dir=" + os.path.join(self.work, "ckpt"),
             "--checkpoint_every=2", "--broadcast_every=1", "--device=cpu"] + list(extra),
            stdout=log, stderr=subprocess.STDOUT)

    def start_rollout(self, i, extra=()):
        log = open(os.path.join(self.work, "rollout-%d.log" % i), "a")
        self.procs["rollout-%d" % i] = subprocess.Popen(
            [self.rollout_bin, "--learner=127.0.0.1:%d" % self.port, "--id=rollout-%d" % i,
             "--metrics_address=127.0.0.1:%d" % self.rollout_metrics[i], "--seed=%d" % i,
             "--group_size=4", "--prompts_per_generation=2", "--max_buffered_groups=4",
             "--min_backoff=50ms", "--max_backoff=500ms", "--device=cpu"] + list(extra),
            stdout=log, stderr=subprocess.STDOUT)

    def learner(self):
        p = self.procs.get("learner")
        check(p is None or p.poll() is None, "the learner is running", quiet=True)
        return scrape(self.learner_metrics)

    def rollout(self, i):
        p = self.procs.get("rollout-%d" % i)
        check(p is None or p.poll() is None, "rollout-%d is running" % i, quiet=True)
        return scrape(self.rollout_metrics[i])

    def listening(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def loaded(self, i):
        """Whether rollout i samples with a snapshot it loaded (its weight
        version reads 0 before any)."""
        return any(k.startswith("asympo_rollout_weights_info") for k in self.rollout(i))

    def submit_errors(self, i):
        return sum(v for k, v in self.rollout(i).items() if k.startswith("asympo_rollout_submit_errors_total"))

    def version(self):
        return int(self.learner().get("asympo_learner_version", -1))

    def rollout_version(self, i):
        return int(self.rollout(i).get("asympo_rollout_weight_version", -1))

    def stop(self, name, sig=signal.SIGTERM, timeout=20):
        p = self.procs.pop(name)
        p.send_signal(sig)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            check(False, "%s stops within %d s of signal %d" % (name, timeout, sig))
        return rc

    def stop_all(self):
        # Rollouts first: a rollout whose learner is gone spends its drain
        # time (5 s) trying to send its last groups.
        for name in sorted(self.procs, key=lambda n: n == "learner"):
            if self.procs[name].poll() is None:
                self.stop(name)


def scenario_train(c):
    c.start_learner()
    c.start_rollout(0)
    c.start_rollout(1)
    wait_for("the learner trains 6 steps", lambda: c.version() >= 6)
    target = c.version()
    for i in (0, 1):
        wait_for("rollout-%d samples with version >= %d" % (i, target),
                 lambda: c.rollout_version(i) >= target)
        wait_for("rollout-%d's groups are accepted" % i,
                 lambda: c.rollout(i).get("asympo_rollout_groups_sent_total", 0) > 0)
        check(c.rollout(i).get("asympo_rollout_weight_failures_total", 0) == 0,
              "rollout-%d had no failed transfer" % i)
        m = c.rollout(i)
        flips, timed = m.get("asympo_rollout_weight_flips_total", 0), m.get(
            "asympo_rollout_weight_load_seconds_count", 0)
        # A load is timed just before its flip is counted.
        check(1 <= flips <= timed <= flips + 1, "rollout-%d timed each of its %d loads (%d)"
              % (i, flips, timed))
    lm = c.learner()
    check(lm.get("asympo_broadcast_receivers", 0) == 2, "the learner counts 2 receivers")
    check(lm.get("asympo_broadcast_version", -1) >= target, "the broadcast version follows the learner")
    for i in (0, 1):
        rc = c.stop("rollout-%d" % i, signal.SIGINT)
        check(rc == 0, "rollout-%d exits 0 on SIGINT" % i)
    check(c.stop("learner", signal.SIGINT) == 0, "the learner exits 0 on SIGINT")
    evaluate_checkpoint(c)


def evaluate_checkpoint(c):
    """asympo-eval on the learner's checkpoints: the newest one, the
    learner's model read from its flags, a JSON report and a summary line."""
    eval_bin = os.path.join(os.path.dirname(c.rollout_bin), "asympo-eval")
    out = os.path.join(c.work, "eval.json")
    r = subprocess.run([eval_bin, "--checkpoint=" + os.path.join(c.work, "ckpt"), "--task=copy",
                        "--k=3", "--max_prompts=10", "--output=" + out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    check(r.returncode == 0, "asympo-eval exits 0 (%s)" % r.stdout[-400:])
    report = json.load(open(out))
    check(report["prompts"] == 10 and report["k"] == 3, "asympo-eval evaluated 10 prompts with k = 3")
    check(0 <= report["mean_at_k"] <= report["pass_at_k"] <= 1, "mean@k <= pass@k, both in [0, 1]")
    newest = sorted(d for d in os.listdir(os.path.join(c.work, "ckpt")) if d.startswith("ckpt-"))[-1]
    summary = r.stdout.strip().splitlines()[-1]
    check("greedy_acc=" in summary and "version %d" % int(newest[5:]) in summary,
          "the summary names the newest checkpoint's version (%s)" % summary)


def scenario_corrupt(c):
    # Versions 3 to 200 are corrupted in transit; 0-2 and 201+ are intact.
    # The learner listens before the rollouts start, so that their receivers
    # register at once instead of waiting out a backoff; and the window is
    # wide (>= 1.4 s at the learner's fastest, 7 ms a step), so that each
    # receiver meets corrupt versions even when it is starved of CPU.
    bad = set(range(3, 201))
    c.start_learner(["--fault_corrupt_broadcast_versions=" + ",".join(map(str, sorted(bad))), "--checkpoint_every=0"])
    wait_for("the learner listens", c.listening, timeout=60, poll=0.05)
    c.start_rollout(0)
    c.start_rollout(1)
    seen = {0: set(), 1: set()}

    def progress():
        for i in (0, 1):
            seen[i].add(c.rollout_version(i))
        return all(max(seen[i]) >= 202 for i in (0, 1))

    wait_for("both rollouts reach version 202 past the corrupt versions", progress, timeout=150, poll=0.05)
    for i in (0, 1):
        check(not (seen[i] & bad), "rollout-%d never sampled with a corrupt version (saw %s)" % (i, sorted(seen[i] - {-1})[:12]))
        m = c.rollout(i)
        check(m.get("asympo_rollout_weight_failures_total", 0) >= 1,
              "rollout-%d counted %d failed transfers" % (i, m.get("asympo_rollout_weight_failures_total", 0)))
    check(c.learner().get("asympo_broadcast_failures_total", 0) >= 1, "the learner counted the reported failures")
    c.stop_all()
    log = open(os.path.join(c.work, "rollout-0.log")).read().lower()
    check("crc" in log or "checksum" in log, "the rollout log names the checksum failure")
    # Over 200 steps in seconds: the per-step line for the first 10, then
    # one per --log_every (10 s) or when the collapse suspicion changes.
    text = open(os.path.join(c.work, "learner.log")).read()
    lines = [l for l in text.splitlines() if "] step " in l]
    steps = re.search(r"stopped after (\d+) steps", text)
    check(steps and int(steps.group(1)) > 200 and 10 <= len(lines) <= 30,
          "the learner logged %d per-step lines for %s steps"
          % (len(lines), steps and steps.group(1)))


def scenario_kill(c):
    # Small, slow chunks: every transfer takes about a second, so a rollout is
    # almost always in the middle of one. Whole versions only: a delta is a
    # chunk or two, over before the kill lands.
    c.start_learner(["--broadcast_chunk_kb=16", "--fault_broadcast_chunk_delay=40ms",
                     "--weight_deltas=false"])
    c.start_rollout(0)
    c.start_rollout(1)
    wait_for("both rollouts load a snapshot", lambda: c.loaded(0) and c.loaded(1))
    # Both have groups accepted: a rollout that started before the learner
    # listened may still be backing off when the learner trains its steps.
    wait_for("both rollouts send groups",
             lambda: all(c.rollout(i).get("asympo_rollout_groups_sent_total", 0) > 0 for i in (0, 1)))
    wait_for("the learner trains 3 steps", lambda: c.version() >= 3, timeout=90)
    failures_before = c.learner().get("asympo_broadcast_failures_total", 0)
    # Kill it while bytes are arriving: in the middle of a transfer.
    fetched = c.rollout(1).get("asympo_rollout_weight_fetch_bytes_total", 0)
    wait_for("rollout-1 is receiving a snapshot",
             lambda: c.rollout(1).get("asympo_rollout_weight_fetch_bytes_total", 0) > fetched,
             timeout=30, poll=0.02)
    check(c.stop("rollout-1", signal.SIGKILL) == -signal.SIGKILL, "rollout-1 killed with SIGKILL")
    wait_for("the learner sees the interrupted transfer",
             lambda: c.learner().get("asympo_broadcast_failures_total", 0) > failures_before, timeout=10)
    v, r0 = c.version(), c.rollout_version(0)
    sent0 = c.rollout(0).get("asympo_rollout_groups_sent_total", 0)
    # The queue holds up to 8 groups (4 steps of 2 prompts): 6 steps take
    # groups rollout-0 sent after the kill.
    wait_for("the learner keeps training with rollout-0 alone", lambda: c.version() >= v + 6, timeout=90)
    wait_for("rollout-0 keeps sending groups",
             lambda: c.rollout(0).get("asympo_rollout_groups_sent_total", 0) > sent0, timeout=30)
    wait_for("rollout-0 keeps receiving versions", lambda: c.rollout_version(0) > r0, timeout=30)
    c.start_rollout(1)
    target = c.version()
    wait_for("restarted rollout-1 catches up to version >= %d" % target,
             lambda: c.rollout_version(1) >= target, timeout=90)
    c.stop_all()


def scenario_restart(c):
    c.start_learner()
    c.start_rollout(0)
    c.start_rollout(1)
    # Both send groups before the kill (the rest of the scenario is about
    # rollouts that were training the learner).
    wait_for("both rollouts send groups",
             lambda: all(c.rollout(i).get("asympo_rollout_groups_sent_total", 0) > 0 for i in (0, 1)))
    wait_for("the learner trains 5 steps", lambda: c.version() >= 5)
    check(c.stop("learner", signal.SIGKILL) == -signal.SIGKILL, "learner killed with SIGKILL")
    wait_for("the rollouts notice the learner is gone",
             lambda: all(c.rollout(i).get("asympo_rollout_learner_connected", 1) == 0 or
                         c.rollout(i).get("asympo_rollout_weight_connected", 1) == 0 for i in (0, 1)), timeout=30)
    # The rollouts go on retrying against the dead learner before it returns.
    errors = [c.submit_errors(i) for i in (0, 1)]
    wait_for("both rollouts retry while the learner is away",
             lambda: all(c.submit_errors(i) > errors[i] for i in (0, 1)), timeout=30)
    c.start_learner(c.learner_args)
    restored = wait_for("the restarted learner serves metrics", lambda: c.learner().get("asympo_learner_version"))
    restored = int(restored)
    check(restored >= 4, "the learner resumed from its checkpoint at version %d" % restored)
    for i in (0, 1):
        wait_for("rollout-%d reconnects and follows the restored learner" % i,
                 lambda: c.rollout_version(i) >= restored + 2 or
                 (c.rollout_version(i) == restored and c.version() > restored))
    wait_for("training goes on with the rollouts' groups", lambda: c.version() >= restored + 4, timeout=90)
    steps = c.learner().get("asympo_learner_steps_total", 0)
    check(steps >= 4, "the restarted learner trained %d steps" % steps)
    c.stop_all()


def scenario_idle(c):
    # Small, slow chunks: the first snapshot takes many seconds to arrive, and
    # until it does the rollout generates nothing and has nothing to send.
    c.start_learner(["--broadcast_chunk_kb=16", "--fault_broadcast_chunk_delay=100ms"])
    c.start_rollout(0)
    wait_for("the rollout's submit client reads the learner's status",
             lambda: c.rollout(0).get("asympo_rollout_learner_connected", 0) == 1)
    wait_for("its first snapshot is arriving",
             lambda: c.rollout(0).get("asympo_rollout_weight_fetch_bytes_total", 0) > 0, poll=0.02)
    check(not c.loaded(0) and c.rollout(0).get("asympo_rollout_groups_sent_total", 0) == 0,
          "it has loaded no snapshot and sent no group")
    check(c.stop("learner", signal.SIGKILL) == -signal.SIGKILL, "learner killed with SIGKILL")
    wait_for("the idle rollout notices the learner is gone (asympo_rollout_learner_connected 0)",
             lambda: c.rollout(0).get("asympo_rollout_learner_connected", 1) == 0, timeout=15)
    errors = c.submit_errors(0)
    wait_for("and counts its attempts to reach it (asympo_rollout_submit_errors_total)",
             lambda: c.submit_errors(0) > errors, timeout=15)
    c.stop_all()


def run_scenario(c, name, body):
    """Runs body(); on a failed check prints the last lines of every log
    under c.work and stops the processes. Ends with "PASS name"."""
    try:
        body()
    except SystemExit:
        for log in sorted(os.listdir(c.work)):
            if log.endswith(".log"):
                print("---- %s (last 25 lines)" % log)
                print("".join(open(os.path.join(c.work, log)).readlines()[-25:]))
        c.stop_all()
        raise
    finally:
        for p in c.procs.values():
            if p.poll() is None:
                p.kill()
    print("PASS", name)


def main():
    scenario, learner_bin, rollout_bin, work = sys.argv[1:5]
    work = os.path.join(work, scenario)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    c = Cluster(learner_bin, rollout_bin, work)
    body = {"train": scenario_train, "corrupt": scenario_corrupt, "kill": scenario_kill,
            "restart": scenario_restart, "idle": scenario_idle}[scenario]
    run_scenario(c, scenario, lambda: body(c))

if __name__ == "__main__":
    main()
