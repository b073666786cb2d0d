"""Delta versions over the learner's weight group (--weight_group=gloo),
with the Python package's WeightGroupReceiver in real worker processes
(python_weight_group_test.py's worker) against a real asympo-learner:

- bfloat16 weights at lr 1e-6 (a few words change per version), versions
  0 to 8 trained one at a time, --delta_keyframe_every=4 and version 3's
  delta corrupted on the learner's side of the broadcast
  (--fault_corrupt_delta_versions=3);
- two workers that take deltas receive versions 1, 2, 5, 6 and 7 as deltas
  and rebuild them; version 3 fails its rebuilt CRC on both, which complete
  it over gRPC (counted as receiver_crc by the learner); 0, 4 and 8 come
  whole (keyframes);
- every version is byte-equal across the workers and to a gRPC
  subscriber's whole fetch of it, and a delta broadcast moves under a
  quarter of the whole version's bytes (asympo_weight_group_bytes_total);
- a missed version: while one worker holds the group's broadcast of
  version 9 up, the learner trains 10 and 11; 11 then goes whole (the
  workers lack its base, 10), and 13 as a delta again;
- a late joiner that takes deltas: the version it joins on goes whole to
  all three, the next one as a delta to all three;
- restarts: the learner, killed at version 14, resumes from its checkpoint
  of 12 as another incarnation; its 12 goes whole to the workers (which
  hold the first incarnation's 14), its 13 as a delta. Stopped at 13 (a
  checkpoint at exit), it resumes at 13 with the same bytes, which the
  workers keep without loading them again; 14 comes as a delta;
- a fourth worker that does not take deltas joins: the next version goes
  whole to all four.
Every version a worker receives, whole or rebuilt, is byte-equal to a gRPC
subscriber's whole fetch of it.

    python3 python_weight_group_deltas_test.py PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc or torch is missing."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from learner_client import check, free_port, torch_or_skip

PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
torch = torch_or_skip()
import asympo_rl  # noqa: E402
from python_weight_group_test import metric, records, wait_for  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = ["--model=tiny", "--tiny_vocab_size=8000", "--threads=1", "--broadcast_bucket_mb=1",
         "--prompts_per_step=2", "--dtype=bfloat16", "--lr=1e-6", "--delta_keyframe_every=4",
         "--fault_corrupt_delta_versions=3", "--weight_group=gloo", "--weight_group_address=127.0.0.1",
         "--weight_group_timeout=20s", "--weight_group_ready_timeout=20s", "--weight_group_join_window=1s"]


def status_of(target):
    return asympo_rl.LearnerClient(target, source="probe").status(timeout=30)


def train_to(target, version):
    """Submits one step's groups at a time until the learner is at `version`."""
    client = asympo_rl.LearnerClient(target, source="feeder")
    deadline = time.time() + 120
    while status_of(target).version < version and time.time() < deadline:
        before = status_of(target).version
        client.submit([asympo_rl.group([1, 4, 8, 3], [([8 + r, 2], float(r == 0)) for r in range(3)],
                                       prompt_id="p%d-%d" % (before, g)) for g in range(2)])
        while status_of(target).version == before and time.time() < deadline:
            time.sleep(0.02)
    check(status_of(target).version == version, "the learner trained to version %d" % version)


class WholeFetches:
    """A gRPC subscriber that fetches versions whole, for comparison."""

    def __init__(self, target, receiver_id):
        self.target = target
        self.sub = asympo_rl.WeightSubscriber(target, receiver_id=receiver_id, deltas=False)
        self.stream = self.sub.snapshots()
        self.digests = {}  # version -> (whole bytes, SHA-256 of its tensors in manifest order)

    def of(self, version):
        """Version `version`'s bytes and digest (older versions announced
        first are passed over)."""
        snap = None
        deadline = time.time() + 60
        while version not in self.digests and time.time() < deadline:
            got = []
            t = threading.Thread(target=lambda: got.append(next(self.stream)), daemon=True)
            t.start()
            t.join(max(deadline - time.time(), 0))
            if not got:
                break
            snap = got[0]
            self.sub.report(snap.version)
            digest = hashlib.sha256()
            for t in snap.manifest.tensors:
                digest.update(bytes(snap.buckets[t.bucket][t.offset:t.offset + t.size_bytes]))
            self.digests[snap.version] = (sum(b.size_bytes for b in snap.manifest.buckets), digest.hexdigest())
        check(version in self.digests, "the gRPC subscriber fetched version %d" % version)
        return self.digests[version]


def scrape(metrics_port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10).read().decode()


class Learner:
    """The learner process under test, stopped and started again on the same
    port and checkpoint directory."""

    def __init__(self):
        self.port, self.metrics_port = free_port(), free_port()
        self.target = "127.0.0.1:%d" % self.port
        self.proc, self.starts = None, 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(WORK, "learner%d.log" % self.starts), "w")
        self.proc = subprocess.Popen(
            [LEARNER, "--listen=" + self.target, "--metrics_address=127.0.0.1:%d" % self.metrics_port,
             "--checkpoint_dir=" + os.path.join(WORK, "ckpt"), "--checkpoint_every=4"] + FLAGS,
            stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.up(), 120, "the learner answers")

    def up(self):
        try:
            status_of(self.target)
            return True
        except Exception:  # noqa: BLE001 - not up yet
            check(self.proc.poll() is None, "the learner is running")
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        check(self.proc.returncode == 0, "the learner exits cleanly")


def main():
    print("torch", torch.__version__)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    learner = Learner()
    learner.start()
    stop_file = os.path.join(WORK, "stop")
    procs = []

    def start(worker_id, deltas):
        out = os.path.join(WORK, worker_id + ".jsonl")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "python_weight_group_test.py"), "worker", PKG, learner.target,
             worker_id, out, stop_file, "0", deltas], stdout=open(out + ".log", "w"), stderr=subprocess.STDOUT))
        return out
    try:
        run(learner, start)
    finally:
        open(stop_file, "w").close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        learner.stop()


def held(out, version):
    return [r for r in records(out) if r["version"] == version and r["complete"]]


def received(outs, v, whole, delta, why):
    """Every worker of `outs` holds version v of the learner's incarnation,
    as a delta (delta True) or whole, byte-equal to the gRPC subscriber's
    whole fetch; returns the whole version's bytes."""
    inc = status_of(whole.target).incarnation
    mine = lambda o: [r for r in held(o, v) if r["incarnation"] == inc]  # noqa: E731
    wait_for(lambda: all(mine(o) for o in outs), 60, "every worker holds version %d" % v)
    recs = [mine(o)[-1] for o in outs]
    whole_bytes, want = whole.of(v)
    check(all(r["sha256"] == want for r in recs),
          "version %d: every worker's tensors are byte-equal to the whole gRPC fetch" % v)
    if delta is not None:
        check(all(r["from_delta"] == delta and r["ok"] and r["fetched"] == 0 for r in recs),
              "version %d came %s to every worker (%s): %s" % (
                  v, "as a delta" if delta else "whole", why,
                  [(r["from_delta"], r["ok"], r["fetched"]) for r in recs]))
    return whole_bytes


def run(learner, start):
    target = learner.target
    outs = [start("d0", "1"), start("d1", "1")]
    whole = WholeFetches(target, "whole")
    keyframes_and_corrupt(learner, outs, whole)
    sent = lambda: metric(scrape(learner.metrics_port), "asympo_weight_group_bytes_total")  # noqa: E731
    # A missed version: d0 holds version 9's broadcast up while 10 and 11
    # are trained; the workers then hold 9, and 11's base is 10.
    open(outs[0] + ".hold", "w").close()
    train_to(target, 9)
    wait_for(lambda: os.path.exists(outs[0] + ".held"), 30, "d0 holds version 9's broadcast up")
    whole.of(9)  # while the learner still keeps it
    train_to(target, 11)
    os.remove(outs[0] + ".hold")
    received(outs, 9, whole, True, "its base, 8, held")
    received(outs, 11, whole, False, "10 missed: the base of 11's delta")
    check(not any(held(o, 10) for o in outs), "no worker received version 10")
    for v, why in ((12, "a keyframe"), (13, "its base, 12, held")):
        train_to(target, v)
        received(outs, v, whole, v == 13, why)
    # A late joiner that takes deltas.
    late = start("late", "1")
    received(outs + [late], 13, whole, None, "")
    check(not held(late, 13)[-1]["from_delta"], "the late joiner received version 13 whole")
    before = sent()
    train_to(target, 14)
    whole_bytes = received(outs + [late], 14, whole, True, "every member, the late joiner too, holds 13")
    check(sent() - before < whole_bytes / 4, "version 14's broadcast to three moved under a quarter of the whole")
    whole.sub.close()
    restarts(learner, outs + [late])
    whole = WholeFetches(target, "whole4")
    # A member that does not take deltas: the group sends whole versions.
    text = scrape(learner.metrics_port)
    deltas_before = metric(text, "asympo_weight_group_delta_versions_total")
    plain = start("plain", "0")
    wait_for(lambda: held(plain, 14), 60, "the fourth worker holds version 14")
    train_to(target, 15)
    received(outs + [late, plain], 15, whole, False, "a member takes no deltas")
    check(metric(scrape(learner.metrics_port), "asympo_weight_group_delta_versions_total") == deltas_before,
          "no delta broadcast with a member that takes none")
    whole.sub.close()


def restarts(learner, outs):
    """The learner, at version 14, killed: it resumes from its checkpoint of
    12 as another incarnation, whose 12 the workers take whole and 13 as a
    delta. Then stopped at 13 (a checkpoint at exit): it resumes at 13 with
    the same bytes, which the workers keep under the new incarnation
    without loading them again; 14 comes as a delta."""
    first = held(outs[0], 14)[-1]["incarnation"]
    learner.proc.kill()
    learner.proc.wait(timeout=60)
    learner.start()
    check(status_of(learner.target).version == 12, "the killed learner resumed from its checkpoint of 12")
    whole = WholeFetches(learner.target, "whole2")
    second = lambda o, v: [r for r in held(o, v) if r["incarnation"] != first]  # noqa: E731
    wait_for(lambda: all(second(o, 12) for o in outs), 120, "every worker holds the resumed learner's 12")
    recs = [second(o, 12)[-1] for o in outs]
    _, want = whole.of(12)
    check(all(r["sha256"] == want and not r["from_delta"] for r in recs),
          "the resumed learner's 12 came whole (the workers held the first incarnation's 14), byte-equal to "
          "its gRPC fetch")
    check(want == [r for r in held(outs[0], 12) if r["incarnation"] == first][-1]["sha256"],
          "the resumed 12 is the first incarnation's 12")
    train_to(learner.target, 13)
    received(outs, 13, whole, True, "every member holds the resumed learner's 12")
    count = len(records(outs[0]))
    whole.sub.close()
    learner.stop()
    learner.start()
    check(status_of(learner.target).version == 13, "the stopped learner resumed at 13")
    # Its group broadcasts its 13 (the members hold another incarnation's),
    # which the workers keep under the new incarnation without loading it.
    wait_for(lambda: metric(scrape(learner.metrics_port), "asympo_weight_group_versions_total") >= 1, 60,
             "the resumed learner's group broadcast its 13")
    train_to(learner.target, 14)
    whole = WholeFetches(learner.target, "whole3")
    received(outs, 14, whole, True, "the resumed 13's bytes were kept under its incarnation")
    check(len(records(outs[0])) == count + 1, "the resumed learner's 13, the same bytes, was not received again")
    whole.sub.close()


def keyframes_and_corrupt(learner, outs, whole):
    """Versions 0 to 8: keyframes at 0, 4 and 8, version 3's delta corrupt."""
    sent_before = 0.0
    for v in range(9):
        if v > 0:
            train_to(learner.target, v)
        whole_bytes = received(outs, v, whole, None, "")
        recs = [held(o, v)[-1] for o in outs]
        sent = metric(scrape(learner.metrics_port), "asympo_weight_group_bytes_total")
        expect_delta = v in (1, 2, 5, 6, 7)
        check(all(r["from_delta"] == (v in (1, 2, 3, 5, 6, 7)) for r in recs),
              "version %d came %s" % (v, "as a delta" if v % 4 else "whole"))
        if v == 3:
            check(all(r["fetched"] > 0 and r["crc_failed"] for r in recs),
                  "version 3's corrupt delta failed its rebuilt CRC and came over gRPC (%s)"
                  % [(r["fetched"], r["crc_failed"]) for r in recs])
        elif expect_delta:
            check(all(r["ok"] and r["fetched"] == 0 for r in recs), "version %d rebuilt from its delta" % v)
            check(sent - sent_before < whole_bytes / 4, "version %d's broadcast moved %d bytes, under a "
                  "quarter of the whole %d" % (v, sent - sent_before, whole_bytes))
        sent_before = sent
    text = scrape(learner.metrics_port)
    check(metric(text, "asympo_weight_group_delta_versions_total") == 6,
          "the learner broadcast 6 versions as deltas (%s)" % metric(text, "asympo_weight_group_delta_versions_total"))
    check(metric(text, "asympo_weight_group_failures_total", 'reason="receiver_crc"') == 2,
          "both workers reported version 3's failed rebuild")
    check(records(outs[0])[-1]["delta_versions"] == 5, "a worker counted 5 versions rebuilt from deltas")


if __name__ == "__main__":
    main()
