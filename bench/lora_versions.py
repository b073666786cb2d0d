"""Versions through the real daemons, full training against low-rank
adapters: an asympo-learner on a 100M-parameter model (random weights
written by asympo-init-model, bfloat16 snapshots, --broadcast_every 1) fed
synthetic groups by a client, and one asympo-rollout that fetches every
version over gRPC, with the learner's adapter flags. Per setup, once the
rollout has loaded --versions versions: the bytes it received per version
(asympo_rollout_weight_fetch_bytes_total over the versions fetched; delta
versions on, as by default), the mean fetch time, request to last checksum
(asympo_rollout_weight_fetch_seconds), and the learner's step time.

    python3 bench/lora_versions.py [--build build] [--work /tmp/asympo-lora-versions]
        [--ranks 8,32,128] [--versions 6]

Prints one JSON object per setup, then a Markdown table. Needs
/usr/bin/python3 with grpc (the checkout's Python package is installed into
WORK/python_pkg)."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import local_run  # noqa: E402

# bench/bench_models.h's "100m": 12 layers, hidden 768, 12 heads (4 KV
# heads of 64), FFN 2048, vocabulary 32000, tied embeddings.
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 768,
          "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
          "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
          "torch_dtype": "bfloat16"}


def metric_sum(scrape, name):
    return sum(v for k, v in scrape.items() if local_run.without_run_label(k).split("{")[0] == name)


def feed(target, stop):
    """Submits one 8-group batch after another until `stop` is set."""
    import asympo_rl
    client = asympo_rl.LearnerClient(target, source="lora-versions")
    i = 0
    while not stop.is_set():
        groups = [asympo_rl.group([1, 5 + g, 9, 3 + i % 90], [([7 + (g + r) % 50] * 24, float(r % 2))
                                                            for r in range(4)], prompt_id="v%d-%d" % (i, g))
                  for g in range(8)]
        try:
            client.submit(groups, timeout=60)
        except Exception:  # the learner is stopping, or its queue is full
            time.sleep(0.5)
        i += 1


def run_setup(args, model, rank, work):
    lora = ["--lora_rank=%d" % rank] if rank else []
    port, lm, rm = local_run.free_port(), local_run.free_port(), local_run.free_port()
    logs = {n: open(os.path.join(work, "%s-%d.log" % (n, rank)), "w") for n in ("learner", "rollout")}
    learner = subprocess.Popen(
        [os.path.join(args.build, "learner_server", "asympo-learner"), "--model=" + model,
         "--listen=127.0.0.1:%d" % port, "--metrics_address=127.0.0.1:%d" % lm, "--insecure",
         "--metrics_insecure", "--dtype=bfloat16", "--prompts_per_step=8", "--broadcast_every=1",
         "--lr=1e-5", "--max_prompt_tokens=64", "--max_response_tokens=64",
         "--micro_batch_tokens=4096", "--device_memory_gib=-1"] + lora,
        stdout=logs["learner"], stderr=subprocess.STDOUT)
    rollout = subprocess.Popen(
        [os.path.join(args.build, "rollout_server", "asympo-rollout"), "--model=" + model,
         "--learner=127.0.0.1:%d" % port, "--metrics_address=127.0.0.1:%d" % rm, "--insecure",
         "--metrics_insecure", "--dtype=bfloat16", "--task=copy", "--group_size=2",
         "--prompts_per_generation=1", "--max_new_tokens=4", "--id=versions"] + lora,
        stdout=logs["rollout"], stderr=subprocess.STDOUT)
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=("127.0.0.1:%d" % port, stop), daemon=True)
    started = time.time()
    try:
        while True:
            r = local_run.scrape(rm, timeout=2) or {}
            if metric_sum(r, "asympo_rollout_weight_fetch_seconds_count") >= 1 and not feeder.is_alive():
                feeder.start()
                base = r
            if feeder.is_alive() and (metric_sum(r, "asympo_rollout_weight_fetch_seconds_count") -
                                      metric_sum(base, "asympo_rollout_weight_fetch_seconds_count")
                                      >= args.versions):
                break
            if learner.poll() is not None or rollout.poll() is not None:
                raise SystemExit("a daemon exited (see %s)" % work)
            if time.time() - started > args.timeout:
                raise SystemExit("no %d versions in %d s (see %s)" % (args.versions, args.timeout, work))
            time.sleep(1)
        learner_scrape = local_run.scrape(lm, timeout=2) or {}
    finally:
        stop.set()
        for p in (rollout, learner):
            p.send_signal(signal.SIGTERM)
        for p in (rollout, learner):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    count = lambda s: metric_sum(s, "asympo_rollout_weight_fetch_seconds_count")  # noqa: E731
    versions = count(r) - count(base)
    seconds = (metric_sum(r, "asympo_rollout_weight_fetch_seconds_sum") -
               metric_sum(base, "asympo_rollout_weight_fetch_seconds_sum"))
    fetched = (metric_sum(r, "asympo_rollout_weight_fetch_bytes_total") -
               metric_sum(base, "asympo_rollout_weight_fetch_bytes_total"))
    steps = metric_sum(learner_scrape, "asympo_learner_step_duration_seconds_count")
    step_s = metric_sum(learner_scrape, "asympo_learner_step_duration_seconds_sum") / max(steps, 1)
    return {"setup": "LoRA r%d" % rank if rank else "full", "versions": versions,
            "bytes_per_version": fetched / max(versions, 1), "fetch_seconds": seconds / max(versions, 1),
            "learner_step_seconds": step_s,
            "snapshot_bytes": metric_sum(learner_scrape, "asympo_broadcast_snapshot_bytes")}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--work", default="/tmp/asympo-lora-versions")
    p.add_argument("--ranks", default="8,32,128")
    p.add_argument("--versions", type=int, default=6)
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    pkg = os.path.join(args.work, "python_pkg")
    subprocess.check_call(["/usr/bin/python3", "-m", "pip", "install", "--quiet", "--no-build-isolation",
                           "--no-deps", "--target", pkg, os.path.join(ROOT, "proto", "python")])
    sys.path.insert(0, pkg)
    config = os.path.join(args.work, "config.json")
    with open(config, "w") as f:
        json.dump(CONFIG, f)
    model = os.path.join(args.work, "model")
    subprocess.check_call([os.path.join(args.build, "learner_server", "asympo-init-model"),
                           "--model=" + config, "--out=" + model])
    rows = []
    for rank in [0] + [int(r) for r in args.ranks.split(",")]:
        rows.append(run_setup(args, model, rank, args.work))
        print(json.dumps(rows[-1]), flush=True)
    print("| setup | bytes a version (received) | fetch s a version | learner step s |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print("| %s | %.2f MiB | %.3f | %.2f |" % (r["setup"], r["bytes_per_version"] / 2**20,
                                                  r["fetch_seconds"], r["learner_step_seconds"]))


if __name__ == "__main__":
    main()
