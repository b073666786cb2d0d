"""Checkpoints written by every rank, read back by any world, with real
processes and Gloo on loopback (tests/data_parallel_rank). Scenarios (one per
run, chosen by the first argument):

  reshard    a world writes a checkpoint after 3 steps (2 fully sharded
             ranks; 3 ZeRO-1 ranks; 1 process); every world of 1, 2 and 3
             ranks in every sharding mode resumes the first (a few the
             others') and saves again at once; the
             weights and both moments of every parameter are bit-equal to the
             writers' (read by an independent reader:
             tests/integration/checkpoint_state.py), and a resumed world
             steps on as one process does
  kill_save  2 ranks (unsharded, then fully sharded) save after every step;
             all are killed with SIGKILL at random points of a save (a random
             delay after its temporary directory appears), 4 times each; each
             time the newest checkpoint left loads in one process, bit-equal
             to the weights the ranks had at its step, and the next start
             removes what the interrupted save left
  not_shared two asympo-learner ranks whose --checkpoint_dir differ (not one
             shared directory) stop at start, naming the flag

    python3 sharded_checkpoint_test.py SCENARIO BUILD_DIR WORK_DIR
Exit 0 on success, 1 on a failed check.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
import local_run  # noqa: E402

try:
    import numpy as np
    import checkpoint_state  # noqa: E402
    from data_parallel_test import check, compare, run_world, weights  # noqa: E402
except ImportError:
    np = None

MODES = {0: "unsharded", 1: "ZeRO-1", 2: "fully sharded"}


def newest(root):
    found = sorted(d for d in os.listdir(root) if d.startswith("ckpt-")) if os.path.isdir(root) else []
    return os.path.join(root, found[-1]) if found else None


def temporaries(root):
    """What unfinished saves left under `root`."""
    return [d for d in os.listdir(root) if d.startswith(".tmp-ckpt-")] if os.path.isdir(root) else []


def resume_and_save(binary, work, src, source, written, world, shard):
    """`world` ranks in mode `shard` resume `src`'s checkpoint and save at
    once: the same weights and moments, in one file per rank."""
    label = "%s -> %d %s rank(s)" % (source, world, MODES[shard])
    out = os.path.join(work, "to-%s-%d-%d" % (os.path.basename(src), world, shard))
    run_world(binary, world, out, "asympo_stable", 3,
              extra=["--shard", str(shard), "--resume", os.path.join(src, "ckpt"), "--first_step",
                     "4", "--save", os.path.join(out, "ckpt"), "--backend", "gloo"])
    again = checkpoint_state.read_state(newest(os.path.join(out, "ckpt")))
    diff = checkpoint_state.equal_states(written, again)
    check(diff is None, "%s: weights and moments bit-equal after the resume (%s)"
          % (label, diff or "all %d parameters" % len(again["weight"])))
    with open(os.path.join(newest(os.path.join(out, "ckpt")), "manifest.json")) as f:
        m = json.load(f)
    check(m["world_size"] == world and len(m["files"]) == world,
          "%s: %d file(s), one per rank" % (label, world))


def scenario_reshard(build, work):
    binary = os.path.join(build, "tests", "data_parallel_rank")
    ref = os.path.join(work, "ref")
    run_world(binary, 1, ref, "asympo_stable", 5)
    every = [(w, m) for w in (1, 2, 3) for m in (0, 1, 2)]
    # Every world and mode resumes the fully sharded pair's checkpoint; the
    # others' reach a few (every mode writes and reads the same pieces).
    targets = {(2, 2): every, (3, 1): [(1, 0), (2, 2), (3, 0)], (1, 0): [(2, 1), (3, 2)]}
    for (src_world, src_shard), to in targets.items():
        source = "%d %s rank(s)" % (src_world, MODES[src_shard])
        src = os.path.join(work, "src-%d-%d" % (src_world, src_shard))
        run_world(binary, src_world, src, "asympo_stable", 3,
                  extra=["--shard", str(src_shard), "--save", os.path.join(src, "ckpt")])
        written = checkpoint_state.read_state(newest(os.path.join(src, "ckpt")))
        check(len(written["exp_avg"]) > 0, "%s wrote moments" % source)
        for world, shard in to:
            resume_and_save(binary, work, src, source, written, world, shard)
        # A resumed world steps on as one process does.
        out = os.path.join(work, "on-%d-%d" % (src_world, src_shard))
        run_world(binary, 2, out, "asympo_stable", 5,
                  extra=["--shard", "2", "--resume", os.path.join(src, "ckpt"), "--first_step", "4"])
        compare(ref, out, 2, 5, "2 fully sharded ranks resumed from " + source, first=4,
                weight_ranks=[0])


def start_world(binary, world, out, steps, extra):
    os.makedirs(out, exist_ok=True)
    port = local_run.free_port()
    return [subprocess.Popen([binary, "--world", str(world), "--rank", str(r), "--port", str(port),
                              "--steps", str(steps), "--out", out] + extra,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for r in range(world)]


def scenario_kill_save(build, work):
    binary = os.path.join(build, "tests", "data_parallel_rank")
    rng = random.Random(int(os.environ.get("KILL_SEED", "7")))
    interrupted = 0  # kills that left a save's temporary directory
    for shard in (0, 2):
        root = os.path.join(work, "ckpt%d" % shard)
        for attempt in range(4):
            out = os.path.join(work, "run%d-%d" % (shard, attempt))
            extra = ["--shard", str(shard), "--save", root, "--save_every", "1"]
            if newest(root) is not None:  # each run goes on from what the last kill left
                extra += ["--resume", root, "--first_step",
                          str(int(os.path.basename(newest(root))[5:]) + 1)]
            procs = start_world(binary, 2, out, 400, extra)
            time.sleep(rng.uniform(1.0, 2.5))
            # At a random point of a save (not the first: one checkpoint is
            # there): once its temporary directory is there.
            deadline = time.time() + 10
            while time.time() < deadline and newest(root) is None:
                time.sleep(0.001)
            while time.time() < deadline and not temporaries(root):
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, 0.004))
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait()
            interrupted += bool(temporaries(root))
            last = newest(root)
            check(last is not None, "%s, kill %d: a checkpoint is there" % (MODES[shard], attempt))
            version = int(os.path.basename(last)[5:])
            # The newest checkpoint loads in one process and saves again alike.
            one = os.path.join(work, "one%d-%d" % (shard, attempt))
            run_world(binary, 1, one, "asympo_stable", version,
                      extra=["--resume", root, "--first_step", str(version + 1), "--save",
                             os.path.join(one, "ckpt")])
            left = temporaries(root)
            check(not left, "%s, kill %d: the start removed what the interrupted save left (%s)"
                  % (MODES[shard], attempt, left))
            state = checkpoint_state.read_state(newest(os.path.join(one, "ckpt")))
            diff = checkpoint_state.equal_states(checkpoint_state.read_state(last), state)
            check(diff is None, "%s, kill %d: version %d reads back bit-equal (%s)"
                  % (MODES[shard], attempt, version, diff))
            # Its weights are those the ranks had after that step (rank 0's dump).
            step = version  # one version per step: no step is skipped here
            dumped = [os.path.join(w, "r0_s%d.bin" % step) for w in
                      [os.path.join(work, "run%d-%d" % (shard, a)) for a in range(attempt + 1)]
                      if os.path.exists(os.path.join(w, "r0_s%d.bin" % step))]
            if dumped:
                flat = np.concatenate([state["weight"][n].ravel() for n in order(last)])
                check(np.array_equal(flat, np.fromfile(dumped[-1], dtype=np.float32)),
                      "%s, kill %d: version %d holds the weights of step %d" % (MODES[shard], attempt, version, step))
    check(interrupted >= 4, "%d of the 8 kills interrupted a save" % interrupted)


def scenario_not_shared(build, work):
    """Two asympo-learner ranks given different --checkpoint_dir: both stop
    at start, rank 1 naming the flag and the shared directory it needs."""
    port = local_run.free_port()
    procs, logs = [], []
    for rank in (0, 1):
        logs.append(os.path.join(work, "rank%d.log" % rank))
        procs.append(subprocess.Popen(
            [os.path.join(build, "learner_server", "asympo-learner"), "--dist_world_size=2",
             "--dist_rank=%d" % rank, "--dist_master_addr=127.0.0.1", "--dist_master_port=%d" % port,
             "--dist_insecure", "--dist_timeout=20s", "--model=tiny", "--tiny_vocab_size=16",
             "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
             "--checkpoint_dir=" + os.path.join(work, "ckpt-of-rank%d" % rank)],
            stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    codes = [p.wait(timeout=120) for p in procs]
    check(all(c != 0 for c in codes), "both ranks stop at start (exit %s)" % codes)
    text = open(logs[1]).read()
    check("--checkpoint_dir=" in text and "same shared directory" in text,
          "rank 1 names --checkpoint_dir and the shared directory it needs: %s" % text.strip()[-300:])
    check("rank(s) 1" in open(logs[0]).read(), "rank 0 names rank 1")


def order(ckpt):
    with open(os.path.join(ckpt, "manifest.json")) as f:
        return [p["name"] for p in json.load(f)["params"]]


def main():
    scenario, build, work = sys.argv[1], sys.argv[2], sys.argv[3]
    if np is None:
        print("SKIP: python3-numpy is missing")
        raise SystemExit(77)
    work = os.path.join(work, "sharded_checkpoint_" + scenario)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    {"reshard": scenario_reshard, "kill_save": scenario_kill_save,
     "not_shared": scenario_not_shared}[scenario](build, work)


if __name__ == "__main__":
    main()
