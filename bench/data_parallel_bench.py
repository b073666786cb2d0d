#!/usr/bin/env python3
"""The data-parallel learner side by side: the single-process learner and
1-3 Gloo ranks (with and without the AdamW moments sharded), on the same
model and the same steps, interleaved round by round so that the machine's
drift hits every world alike. Prints a Markdown table of medians over the
rounds and writes every rank's raw figures as JSON lines.

    bench/data_parallel_bench.py [--build build] [--model 100m] [--rounds 3]
                                 [--steps 3] [--worlds 1,2,3] [--threads N]
                                 [--jsonl FILE]

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
               "--shard", str(int(shard)), "--model", args.model, "--steps", str(args.steps),
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
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()
    binary = os.path.join(args.build, "bench", "data_parallel_bench")
    configs = []
    for w in (int(x) for x in args.worlds.split(",")):
        configs.append((w, False))
        if w > 1:
            configs.append((w, True))
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
                r + 1, world, ", sharded" if shard else "", ranks[0]["step_s"]), file=sys.stderr)
    base = statistics.median(rs[0]["step_s"] for rs in results[configs[0]])
    first = results[configs[0]][0][0]
    print("model %s (%.1fM parameters), %d tokens a step, %d round(s) of %d steps, median of rounds"
          % (args.model, first["parameters"] / 1e6, first["tokens"], args.rounds, args.steps))
    print()
    print("| learner | threads/rank | step (s) | tokens/s | vs 1 process | in collectives | "
          "AdamW moments/rank (MiB) | RSS/rank after (MiB) | peak RSS/rank (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world, shard in configs:
        runs = results[(world, shard)]
        step = statistics.median(rs[0]["step_s"] for rs in runs)
        share = statistics.median(rs[0]["exchange_s"] / rs[0]["step_s"] for rs in runs)
        state = max(x["optimizer_state_bytes"] for x in runs[0])
        rss = statistics.median(max(x["rss_bytes"] for x in rs) for rs in runs)
        peak = statistics.median(max(x["peak_rss_bytes"] for x in rs) for rs in runs)
        name = ("1 process" if world == 1
                else "%d Gloo ranks%s" % (world, ", ZeRO-1" if shard else ""))
        print("| %s | %d | %.2f | %.0f | %.2fx | %s | %.0f | %.0f | %.0f |" % (
            name, runs[0][0]["threads"], step, runs[0][0]["tokens"] / step, base / step,
            "-" if world == 1 else "%.0f%%" % (100 * share), mib(state), mib(rss), mib(peak)))


if __name__ == "__main__":
    main()
