#!/usr/bin/env python3
"""The data-parallel learner side by side: the single-process learner and
1-3 Gloo ranks (nothing sharded, the AdamW moments sharded (ZeRO-1), or
everything sharded (full)), on the same model and the same steps,
interleaved round by round so that the machine's drift hits every world
alike. Prints a Markdown table of medians over the rounds and writes every
rank's raw figures as JSON lines.

    bench/data_parallel_bench.py [--build build] [--model 100m] [--rounds 3]
                                 [--steps 3] [--worlds 1,2,3] [--threads N]
                                 [--shards 0,1,2] [--jsonl FILE]

--shards: 0 nothing sharded, 1 ZeRO-1, 2 full (full also at 1 rank, a
world of one Gloo rank). Memory per rank: the tensors it holds between
steps and their peak in a step (LibTorch's CPU allocations), and its RSS.

The single process uses --threads intra-op threads (default: all cores);
each rank of a world of N uses max(1, threads // N), so every world has the
same cores. With more ranks than cores, the ranks share them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

# The launcher's free-port helper.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy"))
from local_run import free_port  # noqa: E402


def run_world(binary, world, shard, args):
    threads = args.threads if world == 1 else max(1, args.threads // world)
    port = free_port()
    procs = []
    for rank in range(world):
        cmd = [binary, "--world", str(world), "--rank", str(rank), "--port", str(port),
               "--shard", str(shard), "--model", args.model, "--steps", str(args.steps),
               "--warmup", "1", "--threads", str(threads)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True))
    out = []
    for rank, p in enumerate(procs):
        text, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            sys.exit("world %d rank %d failed (exit %d)" % (world, rank, p.returncode))
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


NAMES = {0: "", 1: ", ZeRO-1", 2: ", full"}


def mib(x):
    return x / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="100m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--worlds", default="1,2,3")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--shards", default="0,1")
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bench", "data_parallel_bench")
    shards = [int(x) for x in args.shards.split(",")]
    configs = []
    for w in (int(x) for x in args.worlds.split(",")):
        for shard in shards:
            # One process shards nothing by itself; full runs as a world of one.
            if w > 1 or shard != 1:
                configs.append((w, shard))
    results = {c: [] for c in configs}
    sink = open(args.jsonl, "w") if args.jsonl else None
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for world, shard in order:
            ranks = run_world(binary, world, shard, args)
            results[(world, shard)].append(ranks)
            for x in ranks:
                if sink:
                    sink.write(json.dumps(dict(x, round=r)) + "\n")
            print("round %d: %d rank(s)%s: step %.2f s" % (
                r + 1, world, NAMES[shard], ranks[0]["step_s"]), file=sys.stderr)
    base = statistics.median(rs[0]["step_s"] for rs in results[configs[0]])
    first = results[configs[0]][0][0]
    print("model %s (%.1fM parameters), %d tokens a step, %d round(s) of %d steps, median of rounds"
          % (args.model, first["parameters"] / 1e6, first["tokens"], args.rounds, args.steps))
    print()
    print("| learner | threads/rank | step (s) | tokens/s | vs 1 process | in collectives | "
          "AdamW moments/rank (MiB) | tensors held/rank (MiB) | tensor peak/rank in a step (MiB) | "
          "RSS/rank after (MiB) | peak RSS/rank (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world, shard in configs:
        runs = results[(world, shard)]
        step = statistics.median(rs[0]["step_s"] for rs in runs)
        share = statistics.median(rs[0]["exchange_s"] / rs[0]["step_s"] for rs in runs)
        state = max(x["optimizer_state_bytes"] for x in runs[0])
        held = statistics.median(max(x["held_bytes"] for x in rs) for rs in runs)
        peak_step = statistics.median(max(x["peak_step_bytes"] for x in rs) for rs in runs)
        rss = statistics.median(max(x["rss_bytes"] for x in rs) for rs in runs)
        peak = statistics.median(max(x["peak_rss_bytes"] for x in rs) for rs in runs)
        name = ("1 process" if world == 1 and shard == 0
                else "%d Gloo rank%s%s" % (world, "s" if world > 1 else "", NAMES[shard]))
        print("| %s | %d | %.2f | %.0f | %.2fx | %s | %.0f | %.0f | %.0f | %.0f | %.0f |" % (
            name, runs[0][0]["threads"], step, runs[0][0]["tokens"] / step, base / step,
            "-" if world == 1 and shard == 0 else "%.0f%%" % (100 * share), mib(state), mib(held),
            mib(peak_step), mib(rss), mib(peak)))


if __name__ == "__main__":
    main()
