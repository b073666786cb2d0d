#!/usr/bin/env python3
"""Delta against whole versions through the learner's weight group
(--weight_group=gloo) and its gRPC broadcaster, side by side in one run: a
learner trains a saved model (by default the 100M shape: 12 layers, hidden
768, vocabulary 32000, random bfloat16 weights written by
asympo-init-model) at each of --lrs, one version at a time, each on a new
fed batch of random tokens. After --warmup_steps steps that no receiver
takes (AdamW's first steps move every word), 1 then 2 receivers of each
kind take --versions consecutive versions in turn: weight-group workers
(WeightGroupReceiver, deltas on), then gRPC WeightSubscribers (deltas on,
their default). Versions alternate: an odd one as its delta (every receiver
holds its base), an even one whole (every receiver forgets its copy first).

Per version: the bytes the learner sent (asympo_weight_group_bytes_total,
one broadcast to the group; asympo_broadcast_bytes_total, one fetch per
subscriber), the fraction of 16-bit words that changed (counted by the
receivers, after the timing, against the version before), and for the
slowest receiver the seconds from publish to verified: from the learner's
status first showing the version (the trainer counts it just before staging
it; polled every 2 ms) to the receiver holding it with every bucket's
CRC-32C checked. The receiver's part alone is also given: from Next
answering RECEIVE (group) or the announcement (gRPC) to the verified
snapshot.

    /usr/bin/python3 bench/weight_group_delta_bench.py --build build
        [--lrs 1e-6,1e-5,1e-4] [--warmup_steps 20] [--versions 6] [--workers 1,2]
        [--receiver both|group|subscriber] [--model DIR]
Prints a Markdown table (docs/benchmarks.md, "Delta versions over the weight
group", "Side by side in one run")."""
import argparse
import json
import os
import random
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


def changed_fraction(prev, version, cur):
    """The fraction of 16-bit words of version `version`'s tensors `cur`
    (name -> tensor) that differ from `prev` (the version before's number and
    tensors), or None when the version before was not received."""
    import torch
    if prev[0] + 1 != version or prev[1].keys() != cur.keys():
        return None
    changed = words = 0
    for name, t in cur.items():
        a, b = prev[1][name].contiguous().view(torch.int16), t.contiguous().view(torch.int16)
        changed += int((a != b).sum())
        words += a.numel()
    return changed / words


def worker(pkg, target, worker_id, out):
    """Receives versions until killed: an odd version as a delta, an even one
    whole (the copy forgotten first); a JSON line per version."""
    sys.path.insert(0, pkg)
    import asympo_rl
    rx = asympo_rl.WeightGroupReceiver(target, worker_id, next_wait_ms=1000, deltas=True)
    prev = (0, {})
    with open(out, "a") as f:
        while True:
            if rx.version % 2 == 1:
                # The copy dropped: the next Next does not accept a delta, so
                # the group sends the next version whole (and it is kept).
                rx._base = None
            update = rx.next_update()
            t0 = time.perf_counter()
            cur = dict(update)
            s, end = time.perf_counter() - t0, time.time()
            changed = changed_fraction(prev, update.version, cur)
            f.write(json.dumps({"version": update.version, "s": s, "end": end, "changed": changed,
                                "from_delta": update.from_delta, "ok": update.ok,
                                "complete": update.complete}) + "\n")
            f.flush()
            prev = (update.version, cur)


def subscriber_worker(pkg, target, worker_id, out):
    """The same alternation through a gRPC WeightSubscriber (deltas on, its
    default): seconds from the announcement to the verified snapshot."""
    sys.path.insert(0, pkg)
    import asympo_rl
    sub = asympo_rl.WeightSubscriber(target, worker_id)
    prev = (0, {})
    with open(out, "a") as f:
        for snap in sub.snapshots():
            end = time.time()
            sub.report(snap.version)
            cur = dict(snap.tensors("torch"))
            changed = changed_fraction(prev, snap.version, cur)
            f.write(json.dumps({"version": snap.version, "s": snap.fetch_seconds, "end": end,
                                "changed": changed, "from_delta": snap.from_delta, "ok": True,
                                "complete": True}) + "\n")
            f.flush()
            if snap.version % 2 == 1:
                sub._base = None  # the next one whole
            prev = (snap.version, cur)
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
        """Trains one version on two fed groups of random tokens (a new batch
        every step, as rollouts give: the same batch every step would keep
        AdamW's updates at their full size and change more words); returns
        the version and time.time() when the learner's status first showed
        it (the trainer counts a version just before staging it)."""
        before = self.client.status(timeout=60).version
        import asympo_rl
        rng = random.Random(before)
        groups = []
        for g in range(2):
            prompt = [rng.randrange(4, SHAPE["vocab_size"]) for _ in range(rng.randint(8, 16))]
            rewards = [1.0, 0.0, 1.0, 0.0]
            rng.shuffle(rewards)
            groups.append(asympo_rl.group(
                prompt, [([rng.randrange(4, SHAPE["vocab_size"]) for _ in range(rng.randint(8, 24))], r)
                         for r in rewards], prompt_id="s%d-%d" % (before, g)))
        self.client.submit(groups)
        while self.client.status(timeout=60).version == before:
            time.sleep(0.002)
        return before + 1, time.time()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def measure(args, learner, kind, n_workers, work, tag):
    """Versions through n_workers receivers of `kind` (group, subscriber):
    {from_delta: [(publish to verified s, receiver's s, bytes sent, words
    changed)]}, one per version, the slowest receiver's times."""
    outs = [os.path.join(work, "%s-w%d.jsonl" % (tag, i)) for i in range(n_workers)]
    for o in outs:  # an earlier run's records would answer for this one's
        if os.path.exists(o):
            os.remove(o)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", kind, args.pkg,
                               learner.target, "%s-w%d" % (tag, i), outs[i]], stdout=open(outs[i] + ".log", "w"),
                              stderr=subprocess.STDOUT) for i in range(n_workers)]
    rows = {True: [], False: []}
    try:
        version = learner.client.status(timeout=60).version
        wait_all(outs, version)  # the first version comes whole, joining included
        for _ in range(args.versions):
            sent = bytes_sent(learner.metrics_port, kind)
            version, published = learner.step()
            recs = wait_all(outs, version)
            delta = recs[0]["from_delta"]
            if all(r["from_delta"] == delta and r["ok"] and r["complete"] for r in recs):
                rows[delta].append((max(r["end"] for r in recs) - published, max(r["s"] for r in recs),
                                    bytes_sent(learner.metrics_port, kind) - sent, recs[0]["changed"]))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return rows


def report(lr, n, kind, rows):
    """A Markdown row of medians: delta against whole on `kind`'s path."""
    whole, delta = rows[False], rows[True]
    path = "weight group" if kind == "group" else "gRPC"
    changed = [r[3] for r in whole + delta if r[3] is not None]
    shown = "%.2f%%" % (100 * statistics.median(changed)) if changed else "?"
    if whole and not delta:  # the odd versions came whole too
        return "| %s | %s | %d | %s | %.1f | every version whole (a quarter of the words or more changed) |" % (
            lr, path, n, shown, statistics.median(r[2] for r in whole) / 1e6)
    if not whole or not delta:
        return "| %s | %s | %d | %s | (no whole version measured) |" % (lr, path, n, shown)
    med = [[statistics.median(r[i] for r in rs) for i in range(3)] for rs in (whole, delta)]
    billions = med[0][2] / 2e9 / n if kind == "subscriber" else med[0][2] / 2e9  # bf16 words
    return "| %s | %s | %d | %s | %.1f | %.2f | %.1fx fewer | %.3f (%.2f/B) | %.3f (%.2f/B) | %.2f | %.3f | %.3f |" % (
        lr, path, n, shown,
        med[0][2] / 1e6, med[1][2] / 1e6, med[0][2] / max(med[1][2], 1), med[0][0], med[0][0] / billions,
        med[1][0], med[1][0] / billions, med[1][0] / med[0][0], med[0][1], med[1][1])


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
    p.add_argument("--receiver", choices=("both", "group", "subscriber"), default="both",
                   help="group: WeightGroupReceiver workers; subscriber: gRPC WeightSubscribers; both: "
                        "each of them in turn on the same learner, on consecutive versions")
    p.add_argument("--model", default="",
                   help="a saved model (Hugging Face directory) to start from; by default the 100M "
                        "shape's random weights, written once under --work")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    os.makedirs(args.work, exist_ok=True)
    model = os.path.abspath(args.model) if args.model else os.path.join(args.work, "model-100m")
    if not args.model and not os.path.exists(os.path.join(model, "config.json")):
        cfg = os.path.join(args.work, "100m.json")
        with open(cfg, "w") as f:
            json.dump(SHAPE, f)
        subprocess.run([os.path.join(args.build, "learner_server", "asympo-init-model"), "--model=" + cfg,
                        "--out=" + model, "--dtype=bfloat16"], check=True)
    args.pkg = os.path.join(args.work, "python_pkg")
    shutil.rmtree(args.pkg, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", args.pkg, os.path.join(ROOT, "proto", "python")], check=True)
    kinds = ("group", "subscriber") if args.receiver == "both" else (args.receiver,)
    print("| lr | path | receivers | words changed | whole: MB | delta: MB | bytes | publish to verified, "
          "whole: s | delta: s | delta's time against whole | receiver's part, whole: s | delta: s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for lr in args.lrs.split(","):
        learner = Learner(args, model, lr, args.work)
        try:
            for _ in range(args.warmup_steps):
                learner.step()
            for n in map(int, args.workers.split(",")):
                for kind in kinds:
                    rows = measure(args, learner, kind, n, args.work, "lr%s-%s-n%d" % (lr, kind, n))
                    print(report(lr, n, kind, rows), flush=True)
        finally:
            learner.stop()


if __name__ == "__main__":
    main()
