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
- a third worker that does not take deltas joins: the next version goes
  whole to all three.

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


def whole_fetch(sub, stream, version):
    """Version `version` fetched whole from `stream` (sub.snapshots()), and
    the SHA-256 of its tensors in manifest order."""
    got = []
    t = threading.Thread(target=lambda: got.append(next(stream)), daemon=True)
    t.start()
    t.join(60)
    check(got and got[0].version == version, "the gRPC subscriber fetched version %d" % version)
    snap = got[0]
    sub.report(version)
    digest = hashlib.sha256()
    for t in snap.manifest.tensors:
        digest.update(bytes(snap.buckets[t.bucket][t.offset:t.offset + t.size_bytes]))
    return snap, digest.hexdigest()


def scrape(metrics_port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10).read().decode()


def main():
    print("torch", torch.__version__)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    port, metrics_port = free_port(), free_port()
    target = "127.0.0.1:%d" % port
    log = open(os.path.join(WORK, "learner.log"), "w")
    learner = subprocess.Popen([LEARNER, "--listen=" + target, "--metrics_address=127.0.0.1:%d" % metrics_port]
                               + FLAGS, stdout=log, stderr=subprocess.STDOUT)
    stop_file = os.path.join(WORK, "stop")
    procs = []

    def start(worker_id, deltas):
        out = os.path.join(WORK, worker_id + ".jsonl")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "python_weight_group_test.py"), "worker", PKG, target, worker_id,
             out, stop_file, "0", deltas], stdout=open(out + ".log", "w"), stderr=subprocess.STDOUT))
        return out
    try:
        run(target, metrics_port, start)
    finally:
        open(stop_file, "w").close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        learner.send_signal(signal.SIGTERM)
        learner.wait(timeout=60)
    check(learner.returncode == 0, "the learner exits cleanly")


def held(out, version):
    return [r for r in records(out) if r["version"] == version and r["complete"]]


def run(target, metrics_port, start):
    status_of(target)
    outs = [start("d0", "1"), start("d1", "1")]
    sub = asympo_rl.WeightSubscriber(target, receiver_id="whole", deltas=False)
    stream = sub.snapshots()
    sent_before = 0.0
    for v in range(9):
        if v > 0:
            train_to(target, v)
        wait_for(lambda: all(held(o, v) for o in outs), 60, "both workers hold version %d" % v)
        recs = [held(o, v)[-1] for o in outs]
        snap, want = whole_fetch(sub, stream, v)
        whole_bytes = sum(b.size_bytes for b in snap.manifest.buckets)
        check(all(r["sha256"] == want for r in recs),
              "version %d: both workers' tensors are byte-equal to the whole gRPC fetch" % v)
        sent = metric(scrape(metrics_port), "asympo_weight_group_bytes_total")
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
    text = scrape(metrics_port)
    check(metric(text, "asympo_weight_group_delta_versions_total") == 6,
          "the learner broadcast 6 versions as deltas (%s)" % metric(text, "asympo_weight_group_delta_versions_total"))
    check(metric(text, "asympo_weight_group_failures_total", 'reason="receiver_crc"') == 2,
          "both workers reported version 3's failed rebuild")
    check(records(outs[0])[-1]["delta_versions"] == 5, "a worker counted 5 versions rebuilt from deltas")
    # A member that does not take deltas: the group sends whole versions.
    plain = start("plain", "0")
    wait_for(lambda: held(plain, 8), 60, "the third worker holds version 8")
    train_to(target, 9)
    wait_for(lambda: all(held(o, 9) for o in outs + [plain]), 60, "all three workers hold version 9")
    recs = [held(o, 9)[-1] for o in outs + [plain]]
    check(not any(r["from_delta"] for r in recs) and len({r["sha256"] for r in recs}) == 1,
          "version 9 came whole to all three, byte-equal")
    check(metric(scrape(metrics_port), "asympo_weight_group_delta_versions_total") == 6,
          "no delta broadcast with a member that takes none")


if __name__ == "__main__":
    main()
