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
                                 [--micro_batch_tokens M [--sequence S]
                                  [--micro_batches K] [--checkpointing E]]

--shards: 0 nothing sharded, 1 ZeRO-1, 2 full (full also at 1 rank, a
world of one Gloo rank). Memory per rank: the tensors it holds between
steps and their peak in a step (LibTorch's CPU allocations), and its RSS.

The single process uses --threads intra-op threads (default: all cores);
each rank of a world of N uses max(1, threads // N), so every world has the
same cores. With more ranks than cores, the ranks share them.

--micro_batch_tokens: each rank's share of a step is K micro-batches of M
real tokens in sequences of S tokens (checkpointing E: 0 none, 1 layers, N
every_N), and the table adds each rank's memory plan (asympo-plan's rule on
the CPU in float32, without publisher or checkpoints) against its measured
tensor peak: the check of docs/operations.md, "Memory plan".
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
        if args.micro_batch_tokens:
            cmd += ["--micro_batch_tokens", str(args.micro_batch_tokens), "--sequence",
                    str(args.sequence), "--micro_batches", str(args.micro_batches),
                    "--checkpointing", str(args.checkpointing)]
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


def world_name(world, shard):
    return ("1 process" if world == 1 and shard == 0
            else "%d Gloo rank%s%s" % (world, "s" if world > 1 else "", NAMES[shard]))


def mib(x):
    return x / 2**20


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="100m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--worlds", default="1,2,3")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--shards", default="0,1")
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--micro_batch_tokens", type=int, default=0)
    ap.add_argument("--sequence", type=int, default=512)
    ap.add_argument("--micro_batches", type=int, default=2)
    ap.add_argument("--checkpointing", type=int, default=0)
    args = ap.parse_args()
    if args.micro_batch_tokens and (args.micro_batch_tokens % args.sequence
                                    or args.micro_batch_tokens // args.sequence < 1):
        ap.error("--micro_batch_tokens must be a multiple of --sequence")
    return args


def world_configs(args):
    """The (world, shard) pairs to run, in --worlds then --shards order."""
    shards = [int(x) for x in args.shards.split(",")]
    configs = []
    for w in (int(x) for x in args.worlds.split(",")):
        for shard in shards:
            # One process shards nothing by itself; full runs as a world of one.
            if w > 1 or shard != 1:
                configs.append((w, shard))
    return configs


def run_rounds(binary, configs, args, sink):
    """Every config once a round, each round starting one config later so
    that none always runs first. Returns {config: [ranks' figures, a round]};
    each rank's figures also go to sink (a JSON line, or nowhere when None)."""
    results = {c: [] for c in configs}
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
    return results


def print_plan_table(configs, results):
    """Each config's memory plan per rank against its measured tensor peak."""
    print("| learner | tensor peak/rank in a step (MiB) | plan peak/rank (MiB) | "
          "plan vs measured (worst rank) | plan's peak phase |")
    print("| --- | ---: | ---: | ---: | --- |")
    for world, shard in configs:
        runs = results[(world, shard)]
        measured = statistics.median(max(x["peak_step_bytes"] for x in rs) for rs in runs)
        plan = runs[0][0]["plan_peak_bytes"]
        worst = max((abs(x["plan_peak_bytes"] - x["peak_step_bytes"]) / x["peak_step_bytes"],
                     (x["plan_peak_bytes"] - x["peak_step_bytes"]) / x["peak_step_bytes"])
                    for rs in runs for x in rs)[1]
        print("| %s | %.0f | %.0f | %+.1f%% | %s |" % (
            world_name(world, shard), mib(measured), mib(plan), 100 * worst,
            runs[0][0]["plan_phase"]))
    print()


def print_speed_table(configs, results, base):
    """Each config's step time, throughput, time in collectives and memory
    per rank, medians over the rounds; speed-up against base, the first
    config's median step time."""
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
        name = world_name(world, shard)
        print("| %s | %d | %.2f | %.0f | %.2fx | %s | %.0f | %.0f | %.0f | %.0f | %.0f |" % (
            name, runs[0][0]["threads"], step, runs[0][0]["tokens"] / step, base / step,
            "-" if world == 1 and shard == 0 else "%.0f%%" % (100 * share), mib(state), mib(held),
            mib(peak_step), mib(rss), mib(peak)))


def main():
    args = parse_args()
    binary = os.path.join(args.build, "bench", "data_parallel_bench")
    configs = world_configs(args)
    sink = open(args.jsonl, "w") if args.jsonl else None
    results = run_rounds(binary, configs, args, sink)
    base = statistics.median(rs[0]["step_s"] for rs in results[configs[0]])
    first = results[configs[0]][0][0]
    print("model %s (%.1fM parameters), %d tokens a step, %d round(s) of %d steps, median of rounds"
          % (args.model, first["parameters"] / 1e6, first["tokens"], args.rounds, args.steps))
    planned = bool(args.micro_batch_tokens)
    if planned:
        print("each rank: %d micro-batch(es) of %d tokens in sequences of %d, checkpointing %s"
              % (args.micro_batches, args.micro_batch_tokens, args.sequence,
                 {0: "none", 1: "layers"}.get(args.checkpointing, "every_%d" % args.checkpointing)))
    print()
    if planned:
        print_plan_table(configs, results)
    print_speed_table(configs, results, base)


if __name__ == "__main__":
    main()
