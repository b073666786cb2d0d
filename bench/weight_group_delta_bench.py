#!/usr/bin/env python3
"""Delta against whole versions through the learner's weight group
(--weight_group=gloo), side by side in one run: a learner trains the 100M
model (12 layers, hidden 768, vocabulary 32000; random bfloat16 weights
written by asympo-init-model) at --lrs, one version at a time on fed
batches, and 1 then 2 worker processes (WeightGroupReceiver, deltas on)
receive each version. Versions alternate: an odd one as its delta (every
worker holds its base), an even one whole (every worker forgets its copy
first, so the group sends it whole), both after --warmup_steps steps that
no worker receives (AdamW's first steps move every word).

Per version: the bytes the group broadcast (asympo_weight_group_bytes_total)
and, for the slowest worker, the seconds from Next answering RECEIVE to the
last bucket's tensors in hand (broadcasts, rebuild, CRC-32C, torch views).
The learner's own publishing (the delta's encoding) is not in it:
bench/delta_transfer_bench measures that.

    /usr/bin/python3 bench/weight_group_delta_bench.py --build build
        [--lrs 1e-6,1e-5,1e-4] [--warmup_steps 20] [--versions 6] [--workers 1,2]
        [--receiver group|subscriber]
With --receiver subscriber the receivers are gRPC WeightSubscribers (the
seconds from the announcement to the verified snapshot; the bytes the
learner's broadcaster sent, asympo_broadcast_bytes_total).
Prints a Markdown table (docs/benchmarks.md, "Delta versions over the weight group")."""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "deploy"))
from local_run import free_port  # noqa: E402

SHAPE = {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
         "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64, "tie_word_embeddings": True,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
         "attention_bias": False}


def worker(pkg, target, worker_id, out):
    """Receives versions until killed: an odd version as a delta, an even one
    whole (the copy forgotten first); a JSON line per version."""
    sys.path.insert(0, pkg)
    import asympo_rl
    rx = asympo_rl.WeightGroupReceiver(target, worker_id, next_wait_ms=1000, deltas=True)
    with open(out, "a") as f:
        while True:
            if rx.version % 2 == 1:
                # The copy dropped: the next Next does not accept a delta, so
                # the group sends the next version whole (and it is kept).
                rx._base = None
            update = rx.next_update()
            t0 = time.perf_counter()
            for _ in update:
                pass
            f.write(json.dumps({"version": update.version, "s": time.perf_counter() - t0,
                                "from_delta": update.from_delta, "ok": update.ok,
                                "complete": update.complete}) + "\n")
            f.flush()


def subscriber_worker(pkg, target, worker_id, out):
    """The same alternation through a gRPC WeightSubscriber (deltas on, its
    default): seconds from the announcement to the verified snapshot."""
    sys.path.insert(0, pkg)
    import asympo_rl
    sub = asympo_rl.WeightSubscriber(target, worker_id)
    with open(out, "a") as f:
        for snap in sub.snapshots():
            sub.report(snap.version)
            f.write(json.dumps({"version": snap.version, "s": snap.fetch_seconds,
                                "from_delta": snap.from_delta, "ok": True, "complete": True}) + "\n")
            f.flush()
            if snap.version % 2 == 1:
                sub._base = None  # the next one whole
            del snap


def records(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def bytes_sent(metrics_port, receiver="group"):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10).read().decode()
    name = "asympo_weight_group_bytes_total" if receiver == "group" else "asympo_broadcast_bytes_total"
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % name, text, flags=re.M)
    return float(m.group(1)) if m else 0.0


class Learner:
    def __init__(self, args, model, lr, work):
        self.port, self.metrics_port = free_port(), free_port()
        self.target = "127.0.0.1:%d" % self.port
        self.log = open(os.path.join(work, "learner-%s.log" % lr), "w")
        self.proc = subprocess.Popen(
            [os.path.join(args.build, "learner_server", "asympo-learner"), "--model=" + model,
             "--listen=" + self.target, "--metrics_address=127.0.0.1:%d" % self.metrics_port,
             "--dtype=bfloat16", "--lr=%s" % lr, "--prompts_per_step=2", "--checkpoint_every=0",
             "--max_prompt_tokens=64", "--max_response_tokens=64", "--micro_batch_tokens=512",
             "--delta_keyframe_every=1000000", "--weight_group=gloo", "--weight_group_join_window=1s",
             "--weight_group_timeout=120s", "--weight_group_ready_timeout=120s"],
            stdout=self.log, stderr=subprocess.STDOUT)
        sys.path.insert(0, args.pkg)
        import asympo_rl
        self.client = asympo_rl.LearnerClient(self.target, source="bench")
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise SystemExit("the learner exited (%s); see %s" % (self.proc.returncode, self.log.name))
            try:
                self.client.status(timeout=5)
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.time() > deadline:
                    raise

    def step(self):
        """Trains one version on two fed groups; returns it."""
        before = self.client.status(timeout=60).version
        import asympo_rl
        self.client.submit([asympo_rl.group([1, 40, 80 + g, 3], [([100 + r, 7 + g], float(r == g))
                                                                  for r in range(4)], prompt_id="s%d-%d" % (before, g))
                            for g in range(2)])
        while self.client.status(timeout=60).version == before:
            time.sleep(0.01)
        return before + 1

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def measure(args, learner, n_workers, work, tag):
    outs = [os.path.join(work, "%s-w%d.jsonl" % (tag, i)) for i in range(n_workers)]
    for o in outs:  # an earlier run's records would answer for this one's
        if os.path.exists(o):
            os.remove(o)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", args.receiver, args.pkg,
                               learner.target, "%s-w%d" % (tag, i), outs[i]], stdout=open(outs[i] + ".log", "w"),
                              stderr=subprocess.STDOUT) for i in range(n_workers)]
    rows = {True: [], False: []}
    try:
        version = learner.client.status(timeout=60).version
        wait_all(outs, version)  # the first version comes whole, joining included
        for _ in range(args.versions):
            sent = bytes_sent(learner.metrics_port, args.receiver)
            version = learner.step()
            recs = wait_all(outs, version)
            delta = recs[0]["from_delta"]
            if all(r["from_delta"] == delta and r["ok"] and r["complete"] for r in recs):
                rows[delta].append((max(r["s"] for r in recs),
                                    bytes_sent(learner.metrics_port, args.receiver) - sent))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return rows


def wait_all(outs, version, seconds=600):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = [[r for r in records(o) if r["version"] == version] for o in outs]
        if all(got):
            return [g[-1] for g in got]
        time.sleep(0.05)
    raise SystemExit("the workers did not all receive version %d in %d s" % (version, seconds))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        (worker if sys.argv[2] == "group" else subscriber_worker)(*sys.argv[3:7])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--work", default="/tmp/asympo-group-delta-bench")
    p.add_argument("--lrs", default="1e-6,1e-5,1e-4")
    p.add_argument("--warmup_steps", type=int, default=20)
    p.add_argument("--versions", type=int, default=6)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--receiver", choices=("group", "subscriber"), default="group",
                   help="group: WeightGroupReceiver workers; subscriber: gRPC WeightSubscribers")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    os.makedirs(args.work, exist_ok=True)
    model = os.path.join(args.work, "model-100m")
    if not os.path.exists(os.path.join(model, "config.json")):
        cfg = os.path.join(args.work, "100m.json")
        with open(cfg, "w") as f:
            json.dump(SHAPE, f)
        subprocess.run([os.path.join(args.build, "learner_server", "asympo-init-model"), "--model=" + cfg,
                        "--out=" + model, "--dtype=bfloat16"], check=True)
    args.pkg = os.path.join(args.work, "python_pkg")
    shutil.rmtree(args.pkg, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", args.pkg, os.path.join(ROOT, "proto", "python")], check=True)
    print("| lr | workers | whole: s | delta: s | whole: MB | delta: MB | bytes ratio | time ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for lr in args.lrs.split(","):
        learner = Learner(args, model, lr, args.work)
        try:
            for _ in range(args.warmup_steps):
                learner.step()
            for n in map(int, args.workers.split(",")):
                rows = measure(args, learner, n, args.work, "lr%s-n%d" % (lr, n))
                whole, delta = rows[False], rows[True]
                if not whole or not delta:
                    print("| %s | %d | (no %s version measured) |" % (lr, n, "whole" if not whole else "delta"))
                    continue
                ws, ds = statistics.median(s for s, _ in whole), statistics.median(s for s, _ in delta)
                wb, db = statistics.median(b for _, b in whole), statistics.median(b for _, b in delta)
                print("| %s | %d | %.3f | %.3f | %.1f | %.2f | %.1fx fewer | %.2f |" % (
                    lr, n, ws, ds, wb / 1e6, db / 1e6, wb / max(db, 1), ds / ws), flush=True)
        finally:
            learner.stop()


if __name__ == "__main__":
    main()
