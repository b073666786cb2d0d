#!/usr/bin/env python3
"""The Python client (proto/python) against a live asympo-learner, side by
side in one run, medians of --rounds rounds:

- weights: one snapshot of a random Qwen3-style model (--hidden, --layers,
  --vocab; written here as a model directory the learner loads) fetched
  three ways: the bare FetchSnapshot stream (chunks read and dropped), the
  WeightSubscriber's fetch (buckets assembled, manifest checked, every
  bucket's CRC-32C), and that plus snap.tensors() as torch tensors;
- group: the same snapshot through the learner's weight group
  (--weight_group=gloo) to 1 and to 3 worker processes with
  WeightGroupReceiver (broadcast, CRC-32C, torch views);
- submit: --batches batches of 8 groups x 8 responses x 64 tokens through
  the bare stub's Submit, LearnerClient.submit (batch ids, validation,
  retry loop) and LearnerClient.submit_stream;
- large: --batches batches of 16 groups x 8 responses x 192 tokens, each
  response with its behavior log-probs, through the bare stub's Submit,
  LearnerClient.submit (the client's validation at its heaviest) and
  LearnerClient.submit with a policy version stamped on every response.

    python3 bench/python_client_bench.py --build build [--hidden 512 --layers 8 --vocab 32000]
        [--cases weights,group,submit,large] [--package OTHER_CHECKOUT/proto/python]
Prints Markdown tables (docs/benchmarks.md, "Python client")."""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy"))
from local_run import free_port  # noqa: E402


def write_model(path, hidden, layers, vocab):
    """A random Qwen3-style model directory (config.json, model.safetensors)."""
    import torch
    heads, kv, head_dim, ffn = hidden // 64, max(1, hidden // 128), 64, hidden * 3
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
           "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "max_position_embeddings": 4096, "attention_bias": False, "hidden_act": "silu",
           "torch_dtype": "float32"}
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for i in range(layers):
        p = "model.layers.%d." % i
        shapes.update({p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden],
                       p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
                       p + "self_attn.k_proj.weight": [kv * head_dim, hidden],
                       p + "self_attn.v_proj.weight": [kv * head_dim, hidden],
                       p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
                       p + "self_attn.q_norm.weight": [head_dim], p + "self_attn.k_norm.weight": [head_dim],
                       p + "mlp.gate_proj.weight": [ffn, hidden], p + "mlp.up_proj.weight": [ffn, hidden],
                       p + "mlp.down_proj.weight": [hidden, ffn]})
    os.makedirs(path, exist_ok=True)
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    header, blobs, off = {}, [], 0
    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes.items():
        t = (torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=gen) * 0.02)
        data = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)
    return off


def median(xs):
    return sorted(xs)[len(xs) // 2]


def bench_weights(asympo_rl, target, rounds):
    from asympo_rl import weights as w
    sub = w.WeightSubscriber(target, receiver_id="bench")
    sub.register()
    # The session lives as long as its subscription: keep the stream open.
    announcements = sub._stub.Subscribe(w.wb.SubscribeRequest(session_id=sub.session))
    manifest = next(announcements).manifest
    size = manifest.total_bytes
    times = {"bare": [], "fetch": [], "tensors": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = 0
        for c in sub._stub.FetchSnapshot(w.wb.FetchSnapshotRequest(session_id=sub.session,
                                                                   version=manifest.version)):
            n += len(c.data)
        assert n == size
        times["bare"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snap = sub.fetch(manifest)
        times["fetch"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snap = sub.fetch(manifest)
        tensors = dict(snap.tensors("torch"))
        times["tensors"].append(time.perf_counter() - t0)
        del tensors, snap
    announcements.cancel()
    print("| weights (%.0f MiB snapshot, %d tensors) | seconds | MB/s | vs bare |" % (
        size / 2**20, len(manifest.tensors)))
    print("| --- | ---: | ---: | ---: |")
    base = median(times["bare"])
    for key, label in (("bare", "bare FetchSnapshot stream (chunks dropped)"),
                       ("fetch", "WeightSubscriber.fetch (assembled, manifest and CRC-32C checked)"),
                       ("tensors", "fetch + snap.tensors('torch')")):
        t = median(times[key])
        print("| %s | %.3f | %.0f | %.2f |" % (label, t, size / t / 1e6, base / t))


def bench_submit(asympo_rl, target, batches, rounds, shape=(8, 8, 64), logprobs=False, stream=True):
    """--batches batches of shape (groups, responses, tokens) through the bare
    stub's Submit, LearnerClient.submit and (stream) submit_stream, rounds
    alternating; logprobs: every response carries its behavior log-probs."""
    from asympo_rl import client as c
    import grpc
    n_groups, n_responses, n_tokens = shape
    stub = c.learner_pb2_grpc.LearnerStub(grpc.insecure_channel(target))
    # The learner here never trains: keep every batch (the recovery rule's
    # cost) without ever waiting for a confirmation (an older client, from
    # --package, keeps none).
    try:
        client = asympo_rl.LearnerClient(target, source="bench", max_unconfirmed=10 ** 7)
    except TypeError:
        client = asympo_rl.LearnerClient(target, source="bench")
    client.status()

    def response(i, r):
        tokens = [2 + (i + r + t) % 50 for t in range(n_tokens)]
        lps = [-0.5 - 0.001 * ((i + t) % 7) for t in range(n_tokens)] if logprobs else None
        return asympo_rl.response(tokens, float(r % 2), behavior_logprobs=lps, finish_reason="stop")

    def make(i):
        return [asympo_rl.group([1] * 64, [response(i, r) for r in range(n_responses)],
                                prompt_id="b%d-%d" % (i, g)) for g in range(n_groups)]
    data = [make(i) for i in range(batches)]
    times = {"stub": [], "submit": [], "stamped": [], "stream": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        for gs in data:
            stub.Submit(c.rollout_pb2.RolloutBatch(source="bench", groups=gs), timeout=60)
        times["stub"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for gs in data:
            client.submit(gs)
        times["submit"].append(time.perf_counter() - t0)
        if not stream:  # each response stamped with a policy version: the groups copied
            t0 = time.perf_counter()
            for gs in data:
                client.submit(gs, policy_version=0)
            times["stamped"].append(time.perf_counter() - t0)
        if stream:
            t0 = time.perf_counter()
            client.submit_stream(data)
            times["stream"].append(time.perf_counter() - t0)
    print("\n| submit (%d batches of %d groups x %d x %d tokens%s) | batches/s | groups/s | vs bare |"
          % (batches, n_groups, n_responses, n_tokens, ", behavior log-probs" if logprobs else ""))
    print("| --- | ---: | ---: | ---: |")
    base = median(times["stub"])
    for key, label in (("stub", "bare stub Submit"), ("submit", "LearnerClient.submit"),
                       ("stamped", "LearnerClient.submit(policy_version=0)"),
                       ("stream", "LearnerClient.submit_stream")):
        if times[key]:
            t = median(times[key])
            print("| %s | %.0f | %.0f | %.2f |" % (label, batches / t, n_groups * batches / t, base / t))


GROUP_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from asympo_rl import WeightGroupReceiver
t0 = time.perf_counter()
with WeightGroupReceiver(sys.argv[2], sys.argv[3], join_wait_ms=2000, next_wait_ms=2000) as rx:
    update = rx.next_update(timeout=120)
    t1 = time.perf_counter()
    n = sum(t.numel() * t.element_size() for _, t in update)
    t2 = time.perf_counter()
    print(json.dumps({"join_s": t1 - t0, "receive_s": t2 - t1, "bytes": n, "ok": update.ok,
                      "fetched": update.fetched}))
"""


def bench_group(pkg, target, rounds, workers):
    """Workers (processes of their own) that join the weight group and take
    one version: the time from Next's RECEIVE to the last bucket's tensors
    (broadcast, CRC-32C, views), the slowest worker of each round."""
    receive, join, size = [], [], 0
    for r in range(rounds):
        procs = [subprocess.Popen([sys.executable, "-c", GROUP_WORKER, pkg, target,
                                   "bench-%d-%d-%d" % (workers, r, i)], stdout=subprocess.PIPE, text=True)
                 for i in range(workers)]
        rows = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
        assert all(row["ok"] and row["fetched"] == 0 for row in rows), rows
        receive.append(max(row["receive_s"] for row in rows))
        join.append(max(row["join_s"] for row in rows))
        size = rows[0]["bytes"]
    t = median(receive)
    print("| weight group, Gloo on loopback, %d worker%s | %.3f | %.0f | join + rendezvous %.2f s |" % (
        workers, "" if workers == 1 else "s", t, size / t / 1e6, median(join)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--package", default="",
                    help="the proto/python directory to install (default: this checkout's), e.g. an older "
                         "revision's from git archive, to measure before and after")
    ap.add_argument("--cases", default="weights,submit,large",
                    help="comma-separated: weights, group (the weight group, 1 and 3 workers), submit "
                         "(8x8x64), large (16x8x192 with log-probs)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="python_client_bench")
    pkg = os.path.join(work, "pkg")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", pkg, args.package or os.path.join(root, "proto", "python")], check=True)
    sys.path.insert(0, pkg)
    import asympo_rl
    write_model(os.path.join(work, "model"), args.hidden, args.layers, args.vocab)
    port = free_port()
    learner = subprocess.Popen([os.path.join(args.build, "learner_server", "asympo-learner"),
                                "--listen=127.0.0.1:%d" % port, "--metrics_address=",
                                "--model=" + os.path.join(work, "model"), "--threads=1",
                                "--prompts_per_step=65536", "--queue_capacity=100000",
                                "--max_groups_per_batch=64", "--batch_id_window=100000",
                                "--device_memory_gib=-1"]
                               + (["--weight_group=gloo", "--weight_group_join_window=200ms"]
                                  if "group" in args.cases else []),
                               stdout=open(os.path.join(work, "learner.log"), "w"), stderr=subprocess.STDOUT)
    try:
        target = "127.0.0.1:%d" % port
        asympo_rl.LearnerClient(target, retry_deadline=120).status()
        print("# python_client_bench: %s\n" % " ".join(sys.argv[1:]))
        if "weights" in args.cases:
            bench_weights(asympo_rl, target, args.rounds)
        if "group" in args.cases:
            print("| weights over the weight group (same snapshot) | seconds | MB/s | |")
            print("| --- | ---: | ---: | --- |")
            for n in (1, 3):
                bench_group(pkg, target, args.rounds, n)
            print()
        if "submit" in args.cases:
            bench_submit(asympo_rl, target, args.batches, args.rounds)
        if "large" in args.cases:
            bench_submit(asympo_rl, target, args.batches, args.rounds, shape=(16, 8, 192), logprobs=True,
                         stream=False)
    finally:
        learner.send_signal(signal.SIGTERM)
        learner.wait(timeout=120)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
