"""A learner killed (SIGKILL) in the middle of a weight group broadcast, and
started again at the same address, with a Python WeightGroupReceiver
worker in its own process (python_weight_group_test.py's worker).

Gloo does not see a peer that dies in the middle of a message: its
receiver waits for the collective's whole timeout (60 s here). So the
kill is placed there: while a 51 MB bucket flows to the worker, the
worker is stopped (SIGSTOP) with part of the bucket in its socket, the
learner is killed, and the worker goes on (SIGCONT). Then:

- the worker ends that update as a group failure within seconds, not
  after the collective's timeout, and does not complete it from the
  restarted learner (another incarnation);
- the same worker process joins the restarted learner's group and
  receives its versions whole, each matching a gRPC fetch of it.

    python3 python_weight_group_learner_dies_test.py PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc or torch is missing."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from learner_client import check, free_port

PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
try:
    import torch
except ImportError as e:  # pragma: no cover
    print("SKIP: torch missing:", e)
    sys.exit(77)
import asympo_rl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Vocabulary 200000: the embedding is a bucket of 51 MB, far more than a
# socket's buffers hold, so a stopped worker leaves its broadcast unfinished.
FLAGS = ["--model=tiny", "--tiny_vocab_size=200000", "--threads=1", "--broadcast_bucket_mb=64",
         "--prompts_per_step=2", "--weight_group=gloo", "--weight_group_address=127.0.0.1",
         "--weight_group_timeout=60s", "--weight_group_ready_timeout=10s", "--weight_group_join_window=1s"]
COLLECTIVE_TIMEOUT_S = 60
NOTICE_S = 20   # the worker's unreachable_s is 10 s by default


class Run:
    def __init__(self):
        self.port = free_port()
        self.target = "127.0.0.1:%d" % self.port
        self.stop_file = os.path.join(WORK, "stop")
        self.out = os.path.join(WORK, "w0.jsonl")
        self.learner = self.worker = self.incarnation = None
        self.sent = 0

    def start_learner(self, name):
        log = open(os.path.join(WORK, name + ".log"), "w")
        self.learner = subprocess.Popen([LEARNER, "--listen=" + self.target] + FLAGS,
                                        stdout=log, stderr=subprocess.STDOUT)
        status = asympo_rl.LearnerClient(self.target).status(timeout=60)
        check(status.model_signature != "", "%s is up (incarnation %s)" % (name, status.incarnation))
        self.incarnation = status.incarnation

    def start_worker(self):
        log = open(self.out + ".log", "w")
        self.worker = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "python_weight_group_test.py"), "worker", PKG, self.target, "w0",
             self.out, self.stop_file], stdout=log, stderr=subprocess.STDOUT)

    def feed(self):
        client = asympo_rl.LearnerClient(self.target, source="dies-feeder", timeout=10)
        n = self.sent
        client.submit([asympo_rl.group([1, 4, 8 + (n + g) % 50, 3],
                                       [([8 + (n + g) % 50, 2], 1.0), ([9, 2], 0.0)], prompt_id="d%d-%d" % (n, g))
                       for g in range(2)])
        self.sent += 1

    def records(self):
        if not os.path.exists(self.out):
            return []
        with open(self.out) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def feed_until(self, cond, seconds, what):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if cond():
                return
            self.feed()
            time.sleep(1.0)
        check(False, what)


def gloo_queues(pid, skip_port):
    """(bytes waiting to be read, bytes the far end has yet to send) of
    each established loopback TCP socket of process `pid` whose far port is
    not `skip_port` (its gRPC channel): its Gloo pairs, both ends being on
    this machine."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    with open("/proc/%d/net/tcp" % pid) as f:
        rows = [line.split() for line in f.readlines()[1:]]
    # tx_queue: bytes written and not yet taken by the far end.
    tx_of = {(r[1], r[2]): int(r[4].split(":")[0], 16) for r in rows}
    return [(int(r[4].split(":")[1], 16), tx_of.get((r[2], r[1]), 0)) for r in rows
            if r[9] in inodes and r[3] == "01" and int(r[2].split(":")[1], 16) != skip_port]


def stop_mid_bucket(run, seconds=120):
    """Feeds steps until the worker is caught with part of a bucket in its
    Gloo socket and the rest still to come from the learner, and stops it
    there (SIGSTOP). Returns the bytes waiting for it."""
    pid = run.worker.pid
    deadline = time.time() + seconds
    while time.time() < deadline:
        run.feed()
        watch_until = time.time() + 5.0
        while time.time() < watch_until:
            if any(rx > 0 for rx, _ in gloo_queues(pid, run.port)):
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.5)  # the learner fills the socket's buffers, then waits
                # Unsent bytes at the learner: the bucket cannot complete.
                cut = [rx for rx, tx in gloo_queues(pid, run.port) if rx > 0 and tx > 0]
                if cut:
                    return cut[0]
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.0005)
    check(False, "the worker was caught in the middle of a bucket within %d s" % seconds)


def stopped_records(run):
    """The records the worker wrote before it was stopped. Counted once it
    is stopped, not before: feeding it until it is caught in the middle of
    a bucket can complete earlier versions, whose records are not the
    update the learner dies in."""
    return len(run.records())


def kill_mid_bucket(run, name, at_once):
    """Stops the worker in the middle of a bucket, kills the learner and
    starts the next one: at once (before the worker goes on) when
    `at_once`, else once the worker has ended its update. Checks how the
    worker ended it, then that it receives the new learner's versions
    whole (check_after)."""
    old = run.incarnation
    waiting = stop_mid_bucket(run)
    held = stopped_records(run)
    run.learner.send_signal(signal.SIGKILL)
    run.learner.wait()
    killed_at = time.time()
    if at_once:
        run.start_learner(name)
    os.kill(run.worker.pid, signal.SIGCONT)
    resumed_at = time.time()  # a stopped worker notices nothing
    print("   worker stopped with %d bytes of a bucket in its socket; learner killed%s"
          % (waiting, ", and started again" if at_once else ""))
    deadline = killed_at + COLLECTIVE_TIMEOUT_S + 30
    while len(run.records()) <= held and time.time() < deadline:
        time.sleep(0.1)
    cut = run.records()[held:]
    check(cut, "the worker ended the update the learner died in")
    noticed = cut[0]["t"] - resumed_at
    print("   the worker ended version %d %.1f s after it went on: %s" % (cut[0]["version"], noticed, cut[0]["error"]))
    why = ("the restarted learner no longer counts it, and holds no version of the dead one" if at_once
           else "the learner does not answer")
    check(noticed < NOTICE_S and cut[0]["group_failed"] and not cut[0]["complete"] and cut[0]["incarnation"] == old
          and ("holds it no more" if at_once else "has not answered") in cut[0]["error"],
          "the worker, in the middle of a bucket as the learner died, ended that update as a group failure in "
          "%.1f s (the collective's timeout is %d s): %s" % (noticed, COLLECTIVE_TIMEOUT_S, why))
    if not at_once:
        run.start_learner(name)
    check(run.incarnation != old, "the restarted learner is another incarnation")
    run.feed_until(lambda: sum(r["complete"] and r["incarnation"] == run.incarnation for r in run.records()) >= 2,
                   120, "the worker receives two versions of the restarted learner")
    check_after(run, old, run.incarnation, held)


def exit_after_give_up(run):
    """The learner killed in the middle of a bucket and not started again:
    once the worker has given that collective up (still pending in Gloo,
    until its 60 s timeout), it is asked to stop, and exits cleanly before
    that timeout (no thread of it is left inside the collective). It looks
    at the stop file between long polls: a Join to a dead learner takes
    its join_wait_ms (10 s) and a back-off."""
    stop_mid_bucket(run)
    held = stopped_records(run)
    run.learner.send_signal(signal.SIGKILL)
    run.learner.wait()
    killed_at = time.time()
    os.kill(run.worker.pid, signal.SIGCONT)
    while len(run.records()) <= held and time.time() < killed_at + NOTICE_S + 10:
        time.sleep(0.1)
    check(len(run.records()) > held and run.records()[held]["group_failed"],
          "the worker gave the collective up as the learner died")
    open(run.stop_file, "w").close()
    asked = time.time()
    try:
        run.worker.wait(timeout=45)
    except subprocess.TimeoutExpired:
        run.worker.kill()
    check(run.worker.returncode == 0 and time.time() - killed_at < COLLECTIVE_TIMEOUT_S,
          "asked to stop %.1f s after the kill, with the collective given up still pending, the worker "
          "exited cleanly in %.1f s (exit status %s)" % (asked - killed_at, time.time() - asked,
                                                         run.worker.returncode))


def main():
    t_start = time.time()
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    run = Run()
    try:
        run.start_learner("learner1")
        run.start_worker()
        run.feed_until(lambda: sum(r["complete"] for r in run.records()) >= 2, 120,
                       "the worker received two versions of the first learner")
        kill_mid_bucket(run, "learner2", at_once=False)
        kill_mid_bucket(run, "learner3", at_once=True)
        exit_after_give_up(run)
    finally:
        open(run.stop_file, "w").close()
        if run.worker is not None and run.worker.poll() is None:
            os.kill(run.worker.pid, signal.SIGCONT)
            try:
                run.worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.worker.kill()
        if run.learner is not None and run.learner.poll() is None:
            run.learner.send_signal(signal.SIGTERM)
            run.learner.wait(timeout=60)
    check(run.worker.returncode == 0, "the worker stopped cleanly once asked (it keeps no group waiting)")
    print("all learner-dies checks passed in %.1f s" % (time.time() - t_start))


def check_after(run, first, second, held):
    recs = run.records()
    check(len({r["pid"] for r in recs}) == 1, "the worker was one process throughout")
    check(not any(r["complete"] and r["incarnation"] == first for r in recs[held:]),
          "no version of the dead learner was completed after the kill")
    # The learner may still train on batches fed before the check (a step
    # published after `latest` was read): fetch until the fetched version
    # is one the worker has completed, then compare that version.
    client = asympo_rl.LearnerClient(run.target)
    deadline = time.time() + 90
    while True:
        latest = client.status(timeout=10).version
        while time.time() < deadline and received(run, second, latest) is None:
            time.sleep(0.2)
        sub = asympo_rl.WeightSubscriber(run.target, receiver_id="dies-fetch")
        snap = next(sub.snapshots())
        sub.close()
        if received(run, second, snap.version) is not None or time.time() > deadline:
            break
    rec = received(run, second, snap.version)
    digest = hashlib.sha256()
    for _, t in snap.tensors("torch"):
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    check(rec is not None and snap.incarnation == second and digest.hexdigest() == rec["sha256"],
          "the restarted learner's latest version, %d, as the worker received it is byte for byte a gRPC "
          "fetch of it (worker received it: %s; incarnation %s; digests %s)"
          % (snap.version, rec is not None, snap.incarnation == second,
             rec is not None and digest.hexdigest() == rec["sha256"]))


def received(run, incarnation, version):
    """The worker's completed record of `version` of `incarnation`, or None."""
    recs = [r for r in run.records() if r["complete"] and r["incarnation"] == incarnation and
            r["version"] == version]
    return recs[-1] if recs else None

main()
