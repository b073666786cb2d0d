"""The learner's weight group (--weight_group=gloo) with the Python
package's WeightGroupReceiver in real worker processes, against a real
asympo-learner that trains on fed batches and publishes versions:

- GroupStore on a live generation's store, after a real c10d rendezvous
  with the learner's rank 0 over it: get waits for its key (and times out
  as c10d's stores do), set, add (decimal text), compare_set (c10d's
  rules), check, wait with and without a timeout, num_keys, delete_key;
  an unknown member token is refused with an error naming it; a bad
  worker_id, another backend and another model's signature are refused
  (RefusedError);
- three workers receive the versions as the learner trains; one of them
  finds a bucket's CRC-32C wrong once (injected) and completes that version
  over gRPC while still taking part in the broadcasts; another is killed
  (SIGKILL) mid-run and started again under its worker_id: it catches up
  with the latest version while the other two go on receiving, their
  version sequences continuing across the restart;
- every version is byte-exact: each worker writes per version the SHA-256
  of the tensors' bytes in manifest order and the manifest's bucket CRCs;
  all workers agree per version, and the last version also matches, byte
  for byte, a gRPC FetchSnapshot of it (WeightSubscriber) while the
  learner, no longer fed, still holds it;
- the learner stays healthy: GetStatus answers, /metrics shows the group
  with its three members, the versions it broadcast and exactly the one
  CRC failure reported.

    python3 python_weight_group_test.py PKG_DIR LEARNER_BINARY WORK_DIR
    python3 python_weight_group_test.py worker PKG_DIR TARGET WORKER_ID OUT STOP [CRC_FAULT [DELTAS]]
(the second form is one worker). Exit 0 on success, 1 on a failed check,
77 when grpc or torch is missing."""
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from learner_client import check, free_port

if sys.argv[1] == "worker":
    PKG = sys.argv[2]
else:
    PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
try:
    import torch
except ImportError as e:  # pragma: no cover
    print("SKIP: torch missing:", e)
    sys.exit(77)
import grpc  # noqa: E402
import asympo_rl  # noqa: E402
from asympo_rl import weight_group as wgm  # noqa: E402
from asympo_rl.v1 import weight_group_pb2 as wg, weight_group_pb2_grpc  # noqa: E402

# Vocabulary 8000: the embedding (2 MB) fills a bucket of its own and the
# rest a second one, with buckets of 1 MiB.
GROUP_FLAGS = ["--model=tiny", "--tiny_vocab_size=8000", "--threads=1", "--broadcast_bucket_mb=1",
               "--prompts_per_step=2", "--weight_group=gloo", "--weight_group_address=127.0.0.1",
               "--weight_group_timeout=10s", "--weight_group_ready_timeout=10s",
               "--weight_group_join_window=1s"]


def tensor_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def worker(target, worker_id, out, stop_file, crc_fault, deltas=None):
    """Receives versions until `stop_file` exists; a JSON line per update.
    deltas: the receiver's (None: its default).
    crc_fault > 0: the first bucket of the crc_fault-th update is taken as
    corrupt (its CRC check answers a mismatch). While <out>.hold exists, the
    worker stops before the first bucket of an update (writing its version
    to <out>.held) and waits there, holding the group's broadcast up."""
    rx = asympo_rl.WeightGroupReceiver(target, worker_id, gloo_address="127.0.0.1", next_wait_ms=1000,
                                       deltas=deltas)
    armed = [False]
    real = rx._crc_matches

    def crc_matches(buf, info):
        if armed[0]:
            armed[0] = False
            return False
        return real(buf, info)
    rx._crc_matches = crc_matches
    with open(out, "a") as f:
        for n, update in enumerate(rx.updates(stop=lambda: os.path.exists(stop_file)), start=1):
            armed[0] = n == crc_fault
            if os.path.exists(out + ".hold"):
                with open(out + ".held", "w") as held:
                    held.write("%d\n" % update.version)
                while os.path.exists(out + ".hold"):
                    time.sleep(0.1)
            digest, names, error = hashlib.sha256(), [], ""
            try:
                for name, t in update:
                    names.append(name)
                    digest.update(tensor_bytes(t))
            except asympo_rl.WeightsError as e:
                error = str(e)
            rec = {"worker": worker_id, "pid": os.getpid(), "version": update.version,
                   "incarnation": update.incarnation, "sha256": digest.hexdigest(),
                   "crcs": [b.crc32c for b in update.manifest.buckets], "complete": update.complete,
                   "ok": update.ok, "crc_failed": update.crc_failed, "group_failed": update.group_failed,
                   "faulted": n == crc_fault, "fetched": update.fetched, "error": error,
                   "in_order": names == [t.name for t in update.manifest.tensors],
                   "generation": rx.generation, "from_delta": update.from_delta,
                   "delta_versions": rx.delta_versions, "t": time.time(),
                   "transfer_s": time.monotonic() - update.started_at}
            f.write(json.dumps(rec) + "\n")
            f.flush()
    rx.close()


if sys.argv[1] == "worker":
    worker(*sys.argv[3:7], int(sys.argv[7]) if len(sys.argv) > 7 else 0,
           {"1": True, "0": False}.get(sys.argv[8]) if len(sys.argv) > 8 else None)
    sys.exit(0)


def start_learner(port, metrics_port):
    log = open(os.path.join(WORK, "learner.log"), "w")
    return subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % port,
                             "--metrics_address=127.0.0.1:%d" % metrics_port] + GROUP_FLAGS,
                            stdout=log, stderr=subprocess.STDOUT)


def raises(fn, kind, *words):
    """Runs fn; returns whether it raised `kind` whose text has every word."""
    try:
        fn()
    except kind as e:
        print("   %s: %s" % (type(e).__name__, e))
        return all(w in str(e) for w in words)
    return False


def store_semantics(target, signature):
    """A probe joins alone, rendezvouses with the learner's rank 0 over a
    GroupStore (a real ProcessGroupGloo), then checks the store's calls."""
    channel = grpc.insecure_channel(target)
    stub = weight_group_pb2_grpc.WeightGroupStub(channel)
    deadline = time.time() + 60
    r = None
    while time.time() < deadline and not (r and r.formed):
        r = stub.Join(wg.JoinGroupRequest(worker_id="store-probe", backend="gloo", wait_ms=5000,
                                          model_signature=signature), timeout=30)
    check(r.formed and r.rank == 1 and r.world_size == 2 and r.backend == "gloo" and r.timeout_ms == 10000,
          "a probe joins a generation alone: rank %d of %d, backend %s, timeout %d ms"
          % (r.rank, r.world_size, r.backend, r.timeout_ms))
    store = asympo_rl.GroupStore(channel, r.member_token, datetime.timedelta(seconds=10))
    opts = torch.distributed.ProcessGroupGloo._Options()
    opts._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = datetime.timedelta(seconds=10)
    pg = torch.distributed.ProcessGroupGloo(store, r.rank, r.world_size, opts)
    check(pg.size() == 2, "ProcessGroupGloo rendezvoused with the learner's rank 0 over the GroupStore")

    base = store.num_keys()
    store.set("t/a", b"x")
    check(store.get("t/a") == b"x" and store.num_keys() == base + 1,
          "set then get: the value; num_keys one more (%d over the rendezvous' %d)" % (base + 1, base))
    other = asympo_rl.GroupStore(channel, r.member_token)
    timer = threading.Timer(0.5, lambda: other.set("t/late", b"y"))
    t0 = time.time()
    timer.start()
    got = store.get("t/late")
    waited = time.time() - t0
    check(got == b"y" and waited >= 0.4, "get waits until another client sets the key (%.2f s)" % waited)
    store.set_timeout(datetime.timedelta(seconds=1))
    t0 = time.time()
    check(raises(lambda: store.get("t/never"), RuntimeError, "t/never", "timeout") and time.time() - t0 < 5,
          "get of a key nobody sets times out after the store's timeout (1 s), naming the key")
    store.set_timeout(datetime.timedelta(seconds=10))
    check(store.add("t/n", 3) == 3 and store.add("t/n", 4) == 7 and store.get("t/n") == b"7",
          "add returns the new value and keeps it as decimal text")
    check(store.compare_set("t/c", "", "v1") == b"v1", "compare_set on an unset key, expecting nothing: sets")
    check(store.compare_set("t/c", "zz", "v2") == b"v1" and store.get("t/c") == b"v1",
          "compare_set with the wrong expected value: returns what it holds, unchanged")
    check(store.compare_set("t/c", "v1", "v2") == b"v2" and store.get("t/c") == b"v2",
          "compare_set with the expected value: replaced")
    check(store.compare_set("t/unset", "x", "y") == b"x" and not store.check(["t/unset"]),
          "compare_set on an unset key expecting a value: answers the expected value, sets nothing (c10d)")
    check(store.check(["t/a", "t/n"]) and not store.check(["t/a", "t/none"]), "check, without waiting")
    store.wait(["t/a", "t/c"])
    timer = threading.Timer(0.3, lambda: other.set("t/w", b"1"))
    timer.start()
    store.wait(["t/w"], datetime.timedelta(seconds=5))
    check(raises(lambda: store.wait(["t/none"], datetime.timedelta(milliseconds=500)), RuntimeError, "t/none"),
          "wait: returns once the keys are set; times out on one never set")
    check(store.num_keys() == base + 5, "num_keys counts every key set (%d)" % (base + 5))
    check(store.delete_key("t/a") and not store.delete_key("t/a") and not store.check(["t/a"]) and
          store.num_keys() == base + 4, "delete_key: true once, then false; the key is gone")
    del pg

    bogus = asympo_rl.GroupStore(channel, "no-such-member-token")
    check(raises(lambda: bogus.set("k", b"v"), wgm.GroupStoreError, "FAILED_PRECONDITION",
                 '"no-such-member-token"'),
          "an unknown member token is refused, the learner's error naming it")
    bad = stub.Next(wg.GroupNextRequest(member_token="no-such-member-token", wait_ms=100), timeout=10)
    check(bad.action == wg.GroupNextResponse.ACTION_REJOIN, "Next with an unknown token: REJOIN")
    for kw, words, what in (({"worker_id": ""}, ("worker_id",), "an empty worker_id"),
                            ({"worker_id": "sig", "model_signature": "1-deadbeef"}, ("model_signature",),
                             "another model's signature")):
        rx = asympo_rl.WeightGroupReceiver(target, **kw)
        check(raises(lambda: rx.next_update(timeout=20), asympo_rl.RefusedError, *words),
              "%s is refused (RefusedError)" % what)
        rx.close()
    try:
        stub.Join(wg.JoinGroupRequest(worker_id="n", backend="nccl", wait_ms=100, model_signature=signature),
                  timeout=10)
        check(False, "another backend is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.FAILED_PRECONDITION and "gloo" in e.details(),
              "another backend is refused: %s" % e.details())
    channel.close()


class Feeder(threading.Thread):
    """Submits a batch every `period` seconds while `feeding` is set: the
    learner trains a step and publishes a version for each."""

    def __init__(self, target, period=0.3):
        super().__init__(daemon=True)
        self.client = asympo_rl.LearnerClient(target, source="group-feeder", timeout=10)
        self.period, self.halt, self.feeding, self.sent = period, threading.Event(), threading.Event(), 0
        self.lock = threading.Lock()
        self.feeding.set()

    def step(self):
        with self.lock:
            n = self.sent
            self.client.submit([asympo_rl.group([1, 4, 8 + (n + g) % 50, 3],
                                                [([8 + (n + g) % 50, 2], 1.0), ([9, 2], 0.0)],
                                                prompt_id="f%d-%d" % (n, g)) for g in range(2)])
            self.sent += 1

    def run(self):
        while not self.halt.is_set():
            if self.feeding.wait(0.1):
                self.step()
                self.halt.wait(self.period)


def records(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def wait_for(cond, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    check(False, what)


def metric(text, name, label=""):
    """The value of `name` on the line whose labels include `label`."""
    for labels, value in re.findall(r"^%s(?:\{(.*)\})? (\S+)$" % re.escape(name), text, flags=re.M):
        if label in labels:
            return float(value)
    return None


def main():
    t_start = time.time()
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    port, metrics_port = free_port(), free_port()
    target = "127.0.0.1:%d" % port
    learner = start_learner(port, metrics_port)
    try:
        run(target, learner, metrics_port)
    finally:
        if learner.poll() is None:
            learner.send_signal(signal.SIGTERM)
            learner.wait(timeout=60)
        with open(os.path.join(WORK, "learner.log")) as f:
            print("".join(l for l in f if "weight group" in l)[-4000:])
    check(learner.returncode == 0, "the learner exits cleanly")
    print("all weight group checks passed in %.1f s" % (time.time() - t_start))


def run(target, learner, metrics_port):
    status = asympo_rl.LearnerClient(target).status(timeout=60)
    check(status.model_signature != "", "the learner is up (signature %s)" % status.model_signature)
    store_semantics(target, status.model_signature)

    stop_file = os.path.join(WORK, "stop")
    out = {w: os.path.join(WORK, "%s.jsonl" % w) for w in ("w0", "w1", "w2", "w2-again")}

    def start(worker_id, path, fault=0):
        log = open(path + ".log", "w")
        return subprocess.Popen([sys.executable, __file__, "worker", PKG, target, worker_id, path, stop_file,
                                 str(fault)], stdout=log, stderr=subprocess.STDOUT)
    procs = {"w0": start("w0", out["w0"]), "w1": start("w1", out["w1"], fault=3), "w2": start("w2", out["w2"])}
    feeder = Feeder(target)
    feeder.start()
    wait_for(lambda: all(len(records(out[w])) >= 4 for w in ("w0", "w1", "w2")), 180,
             "each of three workers received 4 versions")
    # w2 dies in the middle of a broadcast: it holds up the next version's
    # first bucket, and is killed. The learner is not fed meanwhile, so that
    # version stays the latest and the others can complete it over gRPC
    # when their collective fails.
    feeder.feeding.clear()
    with feeder.lock:
        open(out["w2"] + ".hold", "w").close()
    feeder.step()
    wait_for(lambda: os.path.exists(out["w2"] + ".held"), 60, "w2 holds a broadcast up")
    with open(out["w2"] + ".held") as f:
        cut = int(f.read())
    time.sleep(1.0)
    procs["w2"].kill()
    procs["w2"].wait()
    killed_at = time.time()
    before = {w: max(r["version"] for r in records(out[w])) for w in ("w0", "w1")}
    print("   w2 killed in the broadcast of version %d; w0 and w1 had versions %s" % (cut, before))
    wait_for(lambda: all(any(r["version"] == cut and r["complete"] for r in records(out[w]))
                         for w in ("w0", "w1")), 60,
             "w0 and w1 received version %d, broadcast as w2 died, whole" % cut)
    print("   version %d reached w0 and w1 with %s buckets fetched over gRPC" % (
        cut, [[r["fetched"] for r in records(out[w]) if r["version"] == cut] for w in ("w0", "w1")]))
    procs["w2-again"] = start("w2", out["w2-again"])
    feeder.feeding.set()
    wait_for(lambda: len(records(out["w2-again"])) >= 2 and
             all(any(r["t"] > killed_at and r["complete"] and r["version"] > before[w] for r in records(out[w]))
                 for w in ("w0", "w1")), 180,
             "the restarted w2 receives versions, and w0 and w1 newer ones than before the kill")
    time.sleep(2.0)
    feeder.halt.set()
    feeder.join()
    final = wait_until_settled(target, out)
    check_versions(out, killed_at, before, final, cut)
    same_as_grpc(target, out, final)
    check_learner(target, learner, metrics_port, procs)
    open(stop_file, "w").close()
    for w in ("w0", "w1", "w2-again"):
        check(procs[w].wait(timeout=60) == 0, "worker %s stops cleanly once asked" % w)
    check(all(p.poll() is not None for p in procs.values()), "every worker has ended")


def wait_until_settled(target, out):
    """Waits until the unfed learner's version stays put and every live
    worker holds it; returns that version."""
    client = asympo_rl.LearnerClient(target)
    holding = lambda w, v: any(r["version"] == v and r["complete"] for r in records(out[w]))  # noqa: E731
    last = [None]

    def settled():
        v = client.status().version
        done = last[0] == v and all(holding(w, v) for w in ("w0", "w1", "w2-again"))
        last[0] = v
        return done
    wait_for(settled, 120, "the learner's last version reaches all three workers")
    print("   the learner's last version, %d, is held by every worker" % last[0])
    return last[0]


def check_versions(out, killed_at, before, final, cut):
    recs = {w: records(out[w]) for w in out}
    everything = [r for rs in recs.values() for r in rs]
    complete = [r for r in everything if r["complete"]]
    check(all(r["in_order"] for r in complete), "every update yielded its tensors in manifest order")
    check(all(0 <= r["transfer_s"] < 120 for r in complete),
          "every update timed its transfer (longest %.2f s)" % max(r["transfer_s"] for r in complete))
    by_version = {}
    for r in complete:
        by_version.setdefault((r["incarnation"], r["version"]), set()).add((r["sha256"], tuple(r["crcs"])))
    shared = [k for k in by_version if sum(1 for r in complete if (r["incarnation"], r["version"]) == k) > 1]
    check(all(len(by_version[k]) == 1 for k in by_version) and len(shared) >= 5,
          "the workers agree on every version's bytes and bucket CRCs (%d versions, %d received by several)"
          % (len(by_version), len(shared)))
    check(all(len(r["crcs"]) >= 2 for r in everything), "every version has at least two buckets")
    for w in ("w0", "w1"):
        versions = [r["version"] for r in recs[w] if r["complete"]]
        after = [r["version"] for r in recs[w] if r["complete"] and r["t"] > killed_at]
        check(len({r["pid"] for r in recs[w]}) == 1 and versions == sorted(set(versions)) and after and
              after[-1] > before[w] and final in versions,
              "%s, one process throughout, received rising versions across the restart: %s" % (w, versions))
    faulted = [r for r in recs["w1"] if r["faulted"]]
    check(len(faulted) == 1 and faulted[0]["crc_failed"] and faulted[0]["complete"] and
          faulted[0]["fetched"] >= 1 and len(by_version[(faulted[0]["incarnation"], faulted[0]["version"])]) == 1,
          "w1's update with the corrupt bucket (version %s) was completed over gRPC (%s buckets), "
          "byte-exact" % (faulted[0]["version"] if faulted else "?", faulted[0]["fetched"] if faulted else 0))
    failed = [(r["worker"], r["version"], r["fetched"]) for r in everything if not r["ok"] and not r["faulted"]]
    check(all(r["complete"] for r in everything) and
          all(v == cut for _, v, _ in failed) and not any(r["crc_failed"] for r in everything if not r["faulted"]),
          "every update was completed; none failed but the one w2 died in (collective failures, with the "
          "buckets fetched over gRPC: %s)" % failed)
    again = [r["version"] for r in recs["w2-again"] if r["complete"]]
    check(again and again[-1] == final and again == sorted(set(again)),
          "the restarted w2 caught up with the latest version (%s)" % again)


def same_as_grpc(target, out, final):
    sub = asympo_rl.WeightSubscriber(target, receiver_id="group-test-fetch")
    snap = next(sub.snapshots())
    sub.close()
    digest = hashlib.sha256()
    for _, t in snap.tensors("torch"):
        digest.update(tensor_bytes(t))
    group = {r["sha256"] for w in ("w0", "w1", "w2-again") for r in records(out[w])
             if r["version"] == final and r["complete"]}
    check(snap.version == final and group == {digest.hexdigest()} and
          [b.crc32c for b in snap.manifest.buckets] ==
          [r for r in records(out["w0"]) if r["version"] == final][-1]["crcs"],
          "version %d as every worker received it is byte for byte the gRPC FetchSnapshot of it" % final)


def check_learner(target, learner, metrics_port, procs):
    check(learner.poll() is None, "the learner is still running")
    status = asympo_rl.LearnerClient(target).status(timeout=10)
    check(status.version > 0, "GetStatus answers (version %d)" % status.version)
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10) as r:
        text = r.read().decode()
    members = metric(text, "asympo_weight_group_members")
    sent = metric(text, "asympo_weight_group_versions_total")
    crc = metric(text, "asympo_weight_group_failures_total", 'reason="receiver_crc"')
    failed = metric(text, "asympo_weight_group_failures_total", 'reason="broadcast"')
    check(members == 3 and sent is not None and sent >= 5 and crc == 1 and failed is not None and failed >= 1,
          "/metrics: %s members, %s versions broadcast, %s CRC failure reported, %s broadcast failed"
          % (members, sent, crc, failed))


if __name__ == "__main__":
    main()
