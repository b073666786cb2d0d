"""The data-parallel learner with real processes and Gloo on loopback.
Scenarios (one per run, chosen by the first argument):

  equality   2 and 3 ranks train the same steps as one process; after every
             step every rank's weights equal the single process's to float
             tolerance and each other's exactly (objectives asympo_stable and
             gpg, whose alpha needs the whole step's totals)
  shard      the same with the AdamW moments sharded across the ranks
             (ZeRO-1: reduce-scatter, AdamW on each rank's part, all-gather)
  full       the same, fully sharded (weights, gradients and moments; each
             layer gathered when it runs), for every objective: rank 0's
             gathered weights equal the single process's after every step
  resume     a checkpoint written by one world is resumed by another (2
             sharded ranks -> 3 -> 3 sharded -> 2 fully sharded -> 3 fully
             sharded -> 1 process), and every leg matches one process
             training all the steps
  skip       a NaN loss on rank 1's share skips that step on every rank, and
             the ranks go on in step with the single process that skipped it
             (ZeRO-1 and fully sharded too)
  publish_peak
             2 and 3 fully sharded ranks publish a version as the learner
             does (rank 0 gathers a unit at a time into its staging, through
             the device buffer or --snapshot_staging=host): every rank's
             tensor memory (a counting allocator) stays within the largest
             unit, where the whole-model gather takes the whole model on rank 0
  one_rank   a world of one Gloo rank (through DataParallel, not the single
             process's path), unsharded, ZeRO-1 and fully sharded, equals one
             process
  nccl       (label gpu) the same over c10d's NCCL on the GPUs there are: one
             rank on one GPU, and 2 ranks on 2 GPUs where there are; every
             sharding mode; skipped (77) without a GPU
  kill       two asympo-learner ranks fed by a rollout daemon: rank 1 killed
             with SIGKILL, then (second run) stopped with SIGSTOP; rank 0
             stops with an error naming the failure within the timeout and
             leaves a valid checkpoint; killing rank 0 stops rank 1 alike

    python3 data_parallel_test.py SCENARIO BUILD_DIR WORK_DIR
Exit 0 on success, 1 on a failed check.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
import local_run  # noqa: E402

try:
    import numpy as np
except ImportError:  # python3-numpy comes with python3-torch
    np = None


LR = 1e-3  # data_parallel_rank's learning rate


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        raise SystemExit(1)
    print("ok:", what)


def run_world(binary, world, out, objective, steps, nan=None, extra=()):
    os.makedirs(out)
    port = local_run.free_port()
    procs = []
    for rank in range(world):
        cmd = [binary, "--world", str(world), "--rank", str(rank), "--port", str(port), "--steps",
               str(steps), "--objective", objective, "--out", out] + list(extra)
        if nan is not None and nan[0] == rank:
            cmd += ["--fault_nan_step", str(nan[1])]
        # LOCAL_RANK: each rank's GPU with --device cuda, as torchrun sets it.
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=dict(os.environ, LOCAL_RANK=str(rank))))
    for rank, p in enumerate(procs):
        text, _ = p.communicate(timeout=180)
        check(p.returncode == 0, "world %d rank %d exits 0 (%s)" % (world, rank, text.strip()[-300:]))


def weights(out, rank, step):
    return np.fromfile(os.path.join(out, "r%d_s%d.bin" % (rank, step)), dtype=np.float32)


def rows(out, rank):
    with open(os.path.join(out, "r%d.csv" % rank)) as f:
        return [line.strip().split(",") for line in f]


def deviation(ref, out, step):
    """The 99.5th percentile and the largest |difference| of rank 0's
    weights after `step` from the single process's."""
    d = np.abs(weights(out, 0, step) - weights(ref, 0, step))
    return float(np.percentile(d, 99.5)), float(d.max())


def compare(ref, out, world, steps, label, first=1, weight_ranks=None, like=None, p995_step=2e-8):
    """weight_ranks: the ranks that wrote weights (fully sharded: rank 0).
    like: an unsharded world's output whose deviation from one process,
    when larger, is the bound (an objective whose rounding AdamW amplifies
    more than the bound allows, whatever the sharding)."""
    ref_rows = [r for r in rows(ref, 0) if int(r[0]) >= first]
    for step in range(first, steps + 1):
        w0 = weights(ref, 0, step)
        for rank in range(world) if weight_ranks is None else weight_ranks:
            w = weights(out, rank, step)
            check(w.shape == w0.shape, "%s step %d rank %d: as many weights" % (label, step, rank))
            if rank > 0:
                check(np.array_equal(w, weights(out, 0, step)),
                      "%s step %d: rank %d's weights equal rank 0's exactly" % (label, step, rank))
        # The ranks sum the gradients in another order than one process, so
        # they differ by float rounding. AdamW divides by sqrt(v) + 1e-8, which
        # turns a rounding difference in a gradient element near 1e-8 into a
        # visible one in its update: a few weights in 10,000 move by up to ~1%
        # of the lr (how many depends on the CPU's BLAS kernels: 12 in
        # 10,000 at step 2 on one 2-core VM, fewer on another). Every other
        # weight agrees to 1e-7, plus 2e-8 a step past the fifth as the
        # rounding differences add up.
        p995, worst = deviation(ref, out, step)
        bound, worst_bound = max(1e-7, p995_step * step), 0.05 * LR * step
        if like is not None:
            plain = deviation(ref, like, step)
            bound, worst_bound = max(bound, 1.1 * plain[0]), max(worst_bound, 1.1 * plain[1])
        check(p995 <= bound and worst <= worst_bound,
              "%s step %d: weights match one process (99.5%% within %.2g <= %.2g, max |diff| %.2g "
              "<= %.2g)" % (label, step, p995, bound, worst, worst_bound))
    for rank in range(world):
        got = rows(out, rank)
        for a, b in zip(ref_rows, got):
            check(a[1] == b[1] and a[2] == b[2], "%s step %s rank %d: same outcome (%s, version %s)"
                  % (label, a[0], rank, b[1], b[2]))
            if a[1] == "ok":
                for i, name in ((3, "loss"), (4, "reward mean"), (5, "grad norm"), (6, "S_P"), (7, "S_N")):
                    x, y = float(a[i]), float(b[i])
                    check(abs(x - y) <= 1e-5 * max(1.0, abs(x)),
                          "%s step %s rank %d: %s %.7g matches %.7g" % (label, a[0], rank, name, y, x))
                check(a[8:] == b[8:], "%s step %s rank %d: responses and tokens %s" % (label, a[0], rank, b[8:]))
            else:
                check(a[3] == b[3], "%s step %s rank %d: skip reason %s" % (label, a[0], rank, b[3]))


def equality(build, work, extra, label, objectives=("asympo_stable", "gpg"), weight_ranks=None):
    binary = os.path.join(build, "tests", "data_parallel_rank")
    for objective in objectives:
        ref = os.path.join(work, objective, "w1")
        run_world(binary, 1, ref, objective, 5)
        for world in (2, 3):
            out = os.path.join(work, objective, "w%d" % world)
            run_world(binary, world, out, objective, 5, extra=extra)
            compare(ref, out, world, 5, "%s, %d ranks%s" % (objective, world, label),
                    weight_ranks=weight_ranks)


def scenario_equality(build, work):
    equality(build, work, [], "")


def scenario_shard(build, work):
    equality(build, work, ["--shard", "1"], ", sharded AdamW")


def scenario_full(build, work):
    """Every objective, 2 and 3 fully sharded ranks against one process:
    within the usual bound, or within what the unsharded ranks reach when
    that is more (naive: AdamW turns the rounding of its near-zero gradient
    elements into 1.2e-7 at the 99.5th percentile by step 3, sharded or
    not)."""
    binary = os.path.join(build, "tests", "data_parallel_rank")
    for objective in ("naive", "spo", "asympo", "asympo_stable", "grpo", "gpg"):
        ref = os.path.join(work, objective, "w1")
        run_world(binary, 1, ref, objective, 5)
        for world in (2, 3):
            plain = os.path.join(work, objective, "plain%d" % world)
            run_world(binary, world, plain, objective, 5)
            out = os.path.join(work, objective, "w%d" % world)
            run_world(binary, world, out, objective, 5, extra=["--shard", "2"])
            compare(ref, out, world, 5, "%s, %d ranks, fully sharded" % (objective, world),
                    weight_ranks=[0], like=plain)


def sharding_modes(build, work, world, extra, label, like_ref=False, common=(), p995_step=2e-8):
    """Every sharding mode over `extra`'s backend and device against one
    process on the same device (like_ref: a second run of that process is
    the run-to-run bound, for a GPU's kernels). The sharded worlds save a
    checkpoint after step 5 (gathered through rank 0's host memory), and a
    world of one rank with the same backend and sharding resumes it (the
    moments scattered from host memory) for step 6."""
    binary = os.path.join(build, "tests", "data_parallel_rank")
    device = [a for a in extra if a in ("cpu", "cuda")]
    device = (["--device", device[0]] if device else []) + list(common)
    for objective in ("asympo_stable", "gpg", "grpo"):
        ref = os.path.join(work, objective, "w1")
        run_world(binary, 1, ref, objective, 6, extra=device)
        again = None
        if like_ref:
            again = os.path.join(work, objective, "again")
            run_world(binary, 1, again, objective, 6, extra=device)
        plain = None
        for shard in (0, 1, 2):
            name = ("unsharded", "ZeRO-1", "fully sharded")[shard]
            out = os.path.join(work, objective, "w%d_shard%d" % (world, shard))
            ckpt = os.path.join(work, objective, "ckpt%d" % shard)
            flags = list(extra) + list(common) + ["--shard", str(shard)]
            run_world(binary, world, out, objective, 5,
                      extra=flags + (["--save", ckpt] if shard else []))
            compare(ref, out, world, 5, "%s, %d %s rank(s), %s" % (objective, world, label, name),
                    weight_ranks=[0] if shard == 2 else None,
                    like=again if world == 1 and like_ref else plain, p995_step=p995_step)
            if shard == 0:
                plain = out
                continue
            resumed = os.path.join(work, objective, "resumed%d" % shard)
            run_world(binary, 1, resumed, objective, 6,
                      extra=flags + ["--resume", ckpt, "--first_step", "6"])
            compare(ref, resumed, 1, 6, "%s, %s checkpoint resumed by one %s rank" % (
                objective, name, label), first=6, like=again, p995_step=p995_step)


def scenario_lora(build, work):
    """Rank-4 adapters (the base frozen): 2 ranks in every sharding mode
    equal one process, and their checkpoints resume in one rank. Every
    adapter element trains (B from zero), so more of them than of a whole
    model's weights carry AdamW's amplified rounding (compare's comment):
    the 99.5th percentile may grow by 1e-7 a step (1.5e-7 measured at step
    4 of grpo) instead of 2e-8; the largest difference keeps its bound."""
    sharding_modes(build, work, 2, ["--backend", "gloo"], "LoRA", common=["--lora_rank", "4"],
                   p995_step=1e-7)


def scenario_publish_peak(build, work):
    binary = os.path.join(build, "tests", "data_parallel_rank")
    for world in (2, 3):
        for staging in ("device", "host"):
            out = os.path.join(work, "w%d_%s" % (world, staging))
            peak = os.path.join(out, "peak")
            run_world(binary, world, out, "asympo", 2,
                      extra=["--shard", "2", "--publish_peak", peak, "--staging", staging])
            for rank in range(world):
                p = json.load(open("%s.%d" % (peak, rank)))
                unit, whole = p["largest_unit"], p["whole"]
                check(whole > 2 * unit, "the model (%d bytes) is more than twice its largest unit (%d)"
                      % (whole, unit))
                check(p["by_units"] <= unit + (64 << 10),
                      "%d ranks, %s staging, rank %d: publishing holds %d bytes of tensors, within the "
                      "largest unit (%d)" % (world, staging, rank, p["by_units"], unit))
                if rank == 0:
                    check(p["whole_gather"] >= whole,
                          "rank 0's whole-model gather holds %d bytes, the whole model (%d)"
                          % (p["whole_gather"], whole))


def scenario_one_rank(build, work):
    sharding_modes(build, work, 1, ["--backend", "gloo"], "Gloo")


def gpu_count(build, work):
    """GPUs this build can use: 0 without nvidia-smi, without a GPU, or with
    a LibTorch that has no CUDA."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    gpus = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    if gpus == 0:
        return 0
    probe = subprocess.run([os.path.join(build, "tests", "data_parallel_rank"), "--steps", "0",
                            "--device", "cuda", "--out", work], capture_output=True, text=True,
                           timeout=300)
    return gpus if probe.returncode == 0 else 0


def scenario_nccl(build, work):
    gpus = gpu_count(build, work)
    if gpus == 0:
        print("SKIP: no GPU this build can use (nvidia-smi -L, --device cuda)")
        raise SystemExit(77)
    print("GPUs:", gpus)
    for world in (1, 2) if gpus >= 2 else (1,):
        sharding_modes(build, work, world, ["--backend", "nccl", "--device", "cuda"], "NCCL",
                       like_ref=True)


def scenario_resume(build, work):
    """Checkpoints are one set whatever wrote them: 2 sharded ranks train
    steps 1-3 and save; 3 ranks (unsharded) resume for steps 4-5; 3 sharded
    ranks resume from that for step 6 and save; 2 fully sharded ranks
    resume for steps 7-8, 3 fully sharded ranks for step 9; one process
    resumes for steps 10-11. Each leg matches one process training steps
    1-11."""
    binary = os.path.join(build, "tests", "data_parallel_rank")
    ref = os.path.join(work, "w1")
    run_world(binary, 1, ref, "asympo_stable", 11)
    names = {0: "unsharded", 1: "sharded", 2: "fully sharded"}
    legs = [(2, 1, 3, 1), (3, 4, 5, 0), (3, 6, 6, 1), (2, 7, 8, 2), (3, 9, 9, 2), (1, 10, 11, 0)]
    previous = None
    for i, (world, first, last, shard) in enumerate(legs):
        out = os.path.join(work, "leg%d" % i)
        extra = ["--first_step", str(first), "--save", os.path.join(out, "ckpt")]
        if shard:
            extra += ["--shard", str(shard)]
        if previous is not None:
            extra += ["--resume", previous]
        run_world(binary, world, out, "asympo_stable", last, extra=extra)
        compare(ref, out, world, last, "%d %s ranks resumed at step %d" % (world, names[shard], first),
                first=first, weight_ranks=[0] if shard == 2 else None)
        previous = os.path.join(out, "ckpt")


def scenario_skip(build, work):
    binary = os.path.join(build, "tests", "data_parallel_rank")
    ref = os.path.join(work, "w1")
    # The single process skips step 2 by its own fault; the world's rank 1 does.
    run_world(binary, 1, ref, "asympo_stable", 4, nan=(0, 2))
    out = os.path.join(work, "w2")
    run_world(binary, 2, out, "asympo_stable", 4, nan=(1, 2))
    check(rows(out, 0)[1][1:] == ["skipped", "1", "nonfinite_loss"],
          "rank 0 skips step 2 with rank 1's reason: %s" % rows(out, 0)[1])
    compare(ref, out, 2, 4, "skip")
    for shard, name in (("1", "sharded"), ("2", "fully sharded")):
        out = os.path.join(work, "w2-shard" + shard)
        run_world(binary, 2, out, "asympo_stable", 4, nan=(1, 2), extra=["--shard", shard])
        check(rows(out, 0)[1][1:] == ["skipped", "1", "nonfinite_loss"],
              "%s: rank 0 skips step 2 with rank 1's reason: %s" % (name, rows(out, 0)[1]))
        compare(ref, out, 2, 4, "skip, " + name, weight_ranks=[0] if shard == "2" else None)


def start_learner(build, work, rank, port, api, metrics, extra=()):
    log = open(os.path.join(work, "rank%d.log" % rank), "w")
    return subprocess.Popen(
        [os.path.join(build, "learner_server", "asympo-learner"), "--dist_world_size=2",
         "--dist_rank=%d" % rank, "--dist_master_addr=127.0.0.1", "--dist_master_port=%d" % port,
         "--dist_insecure", "--dist_timeout=5s", "--model=tiny", "--tiny_vocab_size=16",
         "--listen=127.0.0.1:%d" % api, "--metrics_address=127.0.0.1:%d" % metrics,
         "--prompts_per_step=4", "--queue_capacity=16", "--max_groups_per_batch=8", "--lr=1e-4",
         "--checkpoint_every=5", "--checkpoint_dir=" + os.path.join(work, "ckpt")] + list(extra),
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def kill_one(build, work, victim, sig, extra=(), rank_extra=None):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    port, api, metrics = local_run.free_port(), local_run.free_port(), local_run.free_port()
    ranks = [start_learner(build, work, r, port, api, metrics, list(extra) + (rank_extra or {}).get(r, []))
             for r in (0, 1)]
    rollout = subprocess.Popen(
        [os.path.join(build, "rollout_server", "asympo-rollout"), "--learner=127.0.0.1:%d" % api,
         "--model=tiny", "--tiny_vocab_size=16", "--task=copy", "--group_size=8",
         "--prompts_per_generation=2", "--max_groups_per_batch=8", "--metrics_address=127.0.0.1:0",
         "--min_backoff=50ms", "--max_backoff=500ms"],
        stdout=open(os.path.join(work, "rollout.log"), "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            m = local_run.scrape(metrics) or {}
            if m.get("asympo_learner_steps_total", 0) >= 12:
                break
            time.sleep(0.2)
        check(m.get("asympo_learner_steps_total", 0) >= 12, "two ranks train 12 steps")
        with open(os.path.join(work, "metrics.json"), "w") as f:
            json.dump(m, f)
        ranks[victim].send_signal(sig)
        t0 = time.time()
        survivor = ranks[1 - victim]
        try:
            rc = survivor.wait(45)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.time() - t0
        check(rc is not None and rc != 0, "rank %d exits non-zero %.1f s after rank %d got signal %d (status %s)"
              % (1 - victim, took, victim, sig, rc))
        with open(os.path.join(work, "rank%d.log" % (1 - victim))) as f:
            log = f.read()
        check("data parallel:" in log and "failed" in log,
              "rank %d's log names the failed collective: %s" % (
                  1 - victim, [l for l in log.splitlines() if "data parallel:" in l][-1:]))
    finally:
        for p in ranks + [rollout]:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
    return work


def scenario_kill(build, work):
    w = kill_one(build, os.path.join(work, "sigkill"), 1, signal.SIGKILL)
    ckpts = sorted(d for d in os.listdir(os.path.join(w, "ckpt")) if d.startswith("ckpt-"))
    check(ckpts, "rank 0 left checkpoints (%s)" % ckpts[-1:])
    r = subprocess.run([os.path.join(build, "rollout_server", "asympo-eval"),
                        "--checkpoint=" + os.path.join(w, "ckpt"), "--task=copy", "--k=0",
                        "--output=" + os.path.join(w, "eval.json")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, "the newest checkpoint loads and evaluates")
    kill_one(build, os.path.join(work, "sigstop"), 1, signal.SIGSTOP)
    kill_one(build, os.path.join(work, "rank0"), 0, signal.SIGKILL)
    # Sharded moments: the periodic checkpoints gather them from both ranks;
    # after the kill rank 0 writes none (its state is half elsewhere), and a
    # single-process learner resumes from the newest with all the moments.
    sharded_kill(build, os.path.join(work, "sharded"), ["--dist_shard_optimizer"], "sharded")
    # Fully sharded: the same, and the weights the rollout samples with,
    # the checkpoints and the export are gathered from both ranks. Only
    # published versions are gathered, so the ranks follow rank 0's
    # --broadcast_every (rank 1's own would have them gather different
    # versions, and wait for each other until the collective timeout).
    w = sharded_kill(build, os.path.join(work, "full"),
                     ["--dist_shard=full", "--export_dir=" + os.path.join(work, "full-export")],
                     "fully sharded", rank_extra={0: ["--broadcast_every=2"], 1: ["--broadcast_every=3"]})
    with open(os.path.join(w, "rank0.log")) as f:
        check("full sharding: this rank keeps" in f.read(), "rank 0 logs what it keeps, fully sharded")
    with open(os.path.join(w, "rank1.log")) as f:
        check("--broadcast_every=3 on this rank; rank 0's, 2, holds" in f.read(),
              "rank 1, started with another --broadcast_every, follows rank 0's and says so")
    # Streamed a unit at a time: one shard file per unit, and the index.
    index_path = os.path.join(work, "full-export", "model.safetensors.index.json")
    check(os.path.exists(index_path), "the fully sharded ranks exported the policy with an index")
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
    check(len(files) > 1 and all(os.path.exists(os.path.join(work, "full-export", n)) for n in files),
          "the export holds %d tensors in %d unit files (%s ...)" % (len(weight_map), len(files), files[0]))
    r = subprocess.run([os.path.join(build, "rollout_server", "asympo-eval"),
                        "--model=" + os.path.join(work, "full-export"), "--task=copy", "--k=0",
                        "--output=" + os.path.join(work, "export-eval.json")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, "the unit-by-unit export loads and evaluates (%s)" % r.stdout[-300:])
    with open(os.path.join(w, "metrics.json")) as f:
        m = json.load(f)
    check(m.get("asympo_broadcast_receivers", 0) >= 1 and
          m.get("asympo_broadcast_oldest_receiver_version", 0) >= 5,
          "the rollout fetched the ranks' published weights (version %s at step 12)"
          % m.get("asympo_broadcast_oldest_receiver_version"))


def sharded_kill(build, work, flags, label, rank_extra=None):
    w = kill_one(build, work, 1, signal.SIGKILL, flags, rank_extra)
    ckpts = sorted(d for d in os.listdir(os.path.join(w, "ckpt")) if d.startswith("ckpt-"))
    check(ckpts and int(ckpts[-1][5:]) % 5 == 0,
          "only the periodic checkpoints of the %s ranks are there (%s)" % (label, ckpts))
    with open(os.path.join(w, "ckpt", ckpts[-1], "manifest.json")) as f:
        manifest = json.load(f)
    params = manifest["params"]
    kinds = {(p["kind"], p["param"]) for f in manifest["files"] for p in f["pieces"]}
    check(len(manifest["files"]) == 2 and all(p["moments"] for p in params) and
          all(("exp_avg_sq", p["name"]) in kinds for p in params),
          "the checkpoint holds both moments of all %d parameters, written by both ranks"
          % len(params))
    log_path = os.path.join(w, "resume.log")
    one = subprocess.Popen(
        [os.path.join(build, "learner_server", "asympo-learner"), "--model=tiny",
         "--tiny_vocab_size=16", "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
         "--checkpoint_dir=" + os.path.join(w, "ckpt")],
        stdout=open(log_path, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.time() + 60
    # Not "resumed from": a stop before "ready" is a stop during start-up.
    while time.time() < deadline and one.poll() is None and "ready: " not in open(log_path).read():
        time.sleep(0.2)
    one.send_signal(signal.SIGINT)
    rc = one.wait(30)
    check(rc == 0, "one process resumed the 2 %s ranks' checkpoint and exited 0 (exit %d; log tail: %s)"
          % (label, rc, open(log_path).read()[-600:]))
    check("resumed from" in open(log_path).read() and ckpts[-1] in open(log_path).read(),
          "it resumed from %s" % ckpts[-1])
    return w


def main():
    scenario, build, work = sys.argv[1], sys.argv[2], sys.argv[3]
    if np is None and scenario != "kill":
        print("SKIP: python3-numpy is missing")
        raise SystemExit(77)
    work = os.path.join(work, scenario)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    {"equality": scenario_equality, "shard": scenario_shard, "full": scenario_full,
     "resume": scenario_resume, "one_rank": scenario_one_rank, "nccl": scenario_nccl,
     "lora": scenario_lora, "publish_peak": scenario_publish_peak,
     "skip": scenario_skip, "kill": scenario_kill}[scenario](build, work)
    print("PASS")


if __name__ == "__main__":
    main()
