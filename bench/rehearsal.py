"""The whole system at a size users train, on one machine: a Qwen3-0.6B-shaped
model (random weights written by asympo-init-model) through the daemons.

  - the learner on 2 Gloo ranks, fully sharded (--dist_shard=full, which
    recomputes every layer), packed sequences, a small batch, checkpoints
    every --checkpoint_every steps, snapshots staged in host memory;
  - one rollout daemon on the continuous engine (the copy task);
  - one weight-group worker and one gRPC weight subscriber (the Python
    package: bench/rehearsal_receivers.py), and an outside generator whose
    groups carry a reward signal (a random model earns none on the tasks);
  - after the checkpoint of step --kill_after (checkpoints every
    --checkpoint_every steps), kill -9 of both learner ranks while they
    write the next one (or, with --kill_during step, --kill_delay_s into a
    training step); then one rank (unsharded) resumes, and
    must continue from the checkpoint's version with its exact weights (the
    subscriber's first snapshot of the resumed learner against the
    checkpoint's, converted to the snapshot dtype), to --steps in all.

Every second it samples both learners', the rollout's and the receivers'
resident memory and rank 0's and the rollout's /metrics; per learner
version it reports the time by phase (the learner's step, its publishing,
the rollout's generation and weight fetch, each receiver's arrival) and
the bytes moved. The report (JSON, and Markdown for docs/benchmarks.md)
goes to WORK/report.json and WORK/report.md.

    python3 bench/rehearsal.py [--build build] [--work /tmp/asympo-rehearsal]
        [--shape qwen3-0.6b] [--steps 10] [--checkpoint_every 2] [--kill_after 4]
        [--kill_during save|step] [--kill_delay_s 5]

Needs about 30 GiB of memory and swap together (the six processes' peaks
summed to 28.6 GiB at qwen3-0.6b, the learner's ranks alone plan 9.9 and
7.7 GiB; it refuses to start with less, --min_memory_gib) and 30 GB of disk;
/usr/bin/python3 with torch, numpy and grpc (the checkout's Python package is
installed into WORK/python_pkg at each run)."""
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
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import local_run  # noqa: E402
import rehearsal_checks  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--work", default="/tmp/asympo-rehearsal")
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--checkpoint_every", type=int, default=2)
    p.add_argument("--kill_after", type=int, default=4,
                   help="kill after the checkpoint of this step (a multiple of --checkpoint_every)")
    p.add_argument("--kill_during", choices=("save", "step"), default="save",
                   help="save: while the next checkpoint is written; step: --kill_delay_s into a "
                   "training step, with no save under way")
    p.add_argument("--kill_delay_s", type=float, default=5.0)
    p.add_argument("--prompts_per_step", type=int, default=2)
    p.add_argument("--group_size", type=int, default=2)
    p.add_argument("--max_new_tokens", type=int, default=12)
    p.add_argument("--timeout_min", type=float, default=150)
    p.add_argument("--min_memory_gib", type=float, default=30,
                   help="refuse to start with less memory and swap together (0: no check)")
    a = p.parse_args()
    if a.checkpoint_every < 1 or a.kill_after < a.checkpoint_every or a.kill_after % a.checkpoint_every:
        p.error("--kill_after=%d: no checkpoint of that step is written with --checkpoint_every=%d"
                % (a.kill_after, a.checkpoint_every))
    if a.kill_after >= a.steps:
        p.error("--kill_after=%d: the resumed learner must train on, to --steps=%d" % (a.kill_after, a.steps))
    return a


class Run:
    """The processes of the rehearsal, their logs and what is sampled."""

    def __init__(self, args):
        self.args, self.work = args, args.work
        self.bin = lambda *p: os.path.join(args.build, *p)
        self.port, self.metrics = local_run.free_port(), local_run.free_port()
        self.rollout_metrics = local_run.free_port()
        self.procs = {}
        self.peaks = {}          # name -> largest VmHWM seen (bytes)
        self.versions = []       # one row per learner version seen
        self.failures = []       # what went wrong at this size

    def log(self, name):
        return os.path.join(self.work, name + ".log")

    def start(self, name, cmd, env=None):
        out = open(self.log(name), "w")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env)
        return self.procs[name]

    def learner(self, rank, world, shard, extra=()):
        port = self.dist_port
        cmd = [self.bin("learner_server", "asympo-learner"), "--model=" + self.model,
               "--dtype=bfloat16", "--snapshot_staging=host", "--activation_checkpointing=layers",
               "--prompts_per_step=%d" % self.args.prompts_per_step, "--micro_batch_tokens=128",
               "--max_prompt_tokens=64", "--max_response_tokens=64", "--lr=1e-5",
               "--queue_capacity=8", "--max_groups_per_batch=4",
               "--checkpoint_dir=" + os.path.join(self.work, "ckpt"), "--keep_checkpoints=2",
               "--checkpoint_every=%d" % self.args.checkpoint_every, "--weight_group=gloo",
               "--weight_group_timeout=120s", "--weight_group_ready_timeout=1800s",
               "--listen=127.0.0.1:%d" % self.port, "--metrics_address=127.0.0.1:%d" % self.metrics,
               "--step_csv=" + os.path.join(self.work, "steps.csv"), "--log_every=0",
               "--ready_stall_timeout=3600s", "--partial_step_after=0"]
        if world > 1:
            cmd += ["--dist_world_size=%d" % world, "--dist_rank=%d" % rank, "--dist_insecure",
                    "--dist_master_addr=127.0.0.1", "--dist_master_port=%d" % port,
                    "--dist_shard=" + shard, "--dist_timeout=1800s"]
        return self.start("learner%d" % rank if world > 1 else "learner-resumed", cmd + list(extra))

    def rollout(self):
        return self.start("rollout", [
            self.bin("rollout_server", "asympo-rollout"), "--learner=127.0.0.1:%d" % self.port,
            "--model=" + self.model, "--dtype=bfloat16", "--task=copy",
            "--group_size=%d" % self.args.group_size, "--max_new_tokens=%d" % self.args.max_new_tokens,
            "--max_running_sequences=4", "--metrics_address=127.0.0.1:%d" % self.rollout_metrics,
            # No spare model for in-flight updates: 1.2 GB less for this machine.
            "--weight_update=between_batches",
            "--id=rehearsal-rollout", "--insecure"])

    def receivers(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(self.work, "python_pkg"))
        for role in ("group", "subscriber", "feeder"):
            self.start(role, ["/usr/bin/python3", os.path.join(HERE, "rehearsal_receivers.py"), role,
                              "127.0.0.1:%d" % self.port, os.path.join(self.work, role + ".jsonl")],
                       env=env)

    def sample(self):
        for name, p in self.procs.items():
            if p.poll() is None:
                self.peaks[name] = max(self.peaks.get(name, 0), rehearsal_checks.hwm(p.pid))

    def stop(self, names, sig=signal.SIGKILL):
        for n in names:
            p = self.procs.get(n)
            if p is not None and p.poll() is None:
                p.send_signal(sig)
        for n in names:
            p = self.procs.get(n)
            if p is not None:
                try:
                    p.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def check_memory(need_gib):
    """Refuses to start on a machine whose memory and swap together are
    below `need_gib`: the kernel would kill a learner rank mid-run."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[1:]}
    have = (info.get("MemTotal", 0) + info.get("SwapTotal", 0)) / 2**20
    if need_gib > 0 and have < need_gib:
        raise SystemExit(
            "this machine has %.1f GiB of memory and swap together; the rehearsal needs about %.0f "
            "(--min_memory_gib). Add swap, for example:\n  fallocate -l %dG /swapfile && chmod 600 "
            "/swapfile && mkswap /swapfile && swapon /swapfile" % (have, need_gib, int(need_gib - have) + 2))


def prepare(run):
    a = run.args
    check_memory(a.min_memory_gib)
    os.makedirs(a.work, exist_ok=True)
    # An earlier run's learner still stopping writes a final checkpoint.
    busy = rehearsal_checks.processes_using(a.work)
    if busy:
        raise SystemExit("processes of an earlier run still use %s; stop them first:\n  %s"
                         % (a.work, "\n  ".join(busy)))
    for d in ("ckpt",):
        shutil.rmtree(os.path.join(a.work, d), ignore_errors=True)
    for f in ("steps.csv", "group.jsonl", "subscriber.jsonl", "feeder.jsonl"):
        if os.path.exists(os.path.join(a.work, f)):
            os.remove(os.path.join(a.work, f))
    name = os.path.basename(a.shape)
    run.model = os.path.join(a.work, "model-" + (name[:-5] if name.endswith(".json") else name))
    if not os.path.exists(os.path.join(run.model, "config.json")):
        subprocess.run([run.bin("learner_server", "asympo-init-model"), "--model=" + a.shape,
                        "--out=" + run.model, "--dtype=bfloat16"], check=True)
    # Installed again each run: the checkout's package, not an earlier run's.
    pkg = os.path.join(a.work, "python_pkg")
    shutil.rmtree(pkg, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--quiet", "--no-build-isolation",
                    "--no-deps", "--target", pkg, os.path.join(ROOT, "proto", "python")],
                   check=True)
    run.dist_port = local_run.free_port()
    base = os.path.join(a.work, "base.jsonl")
    if os.path.exists(base):
        os.remove(base)
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "rehearsal_receivers.py"), "base", "-", base],
                   env=dict(os.environ, PYTHONPATH=pkg), check=True)
    run.python_base = rehearsal_checks.read_jsonl(base)[0]["python_base_bytes"]


def first_leg(run):
    """2 fully sharded ranks, the rollout and the receivers, until the
    checkpoint of step --kill_after is written and the next save is under
    way: then every learner rank is killed."""
    a = run.args
    run.learner(0, 2, "full")
    run.learner(1, 2, "full")
    run.rollout()
    run.receivers()
    ckpt = os.path.join(a.work, "ckpt")
    deadline = time.time() + a.timeout_min * 60
    killed_during_save = False
    in_save = a.kill_during == "save"
    while time.time() < deadline:
        rehearsal_checks.poll(run)
        if any(run.procs[n].poll() is not None for n in ("learner0", "learner1")):
            run.failures.append("a learner rank exited before the kill (see learner0.log, learner1.log)")
            break
        done = rehearsal_checks.checkpoints(ckpt)
        if done and done[-1] >= a.kill_after and rehearsal_checks.saving(ckpt) == in_save:
            time.sleep(1.0 if in_save else a.kill_delay_s)  # into the save, or the step after it
            killed_during_save = rehearsal_checks.saving(ckpt)
            break
        time.sleep(1.0)
    run.sample()
    run.killed_at = rehearsal_checks.checkpoints(ckpt)
    run.kill_time = time.time()
    run.stop(["learner0", "learner1"])
    run.killed_during_save = killed_during_save
    if killed_during_save != in_save:
        run.failures.append("the kill did not land during a %s" % a.kill_during)
    run.left_after_kill = rehearsal_checks.listing(ckpt)


def second_leg(run):
    """One unsharded rank resumes; the rollout and the receivers go on with
    it, to --steps in all."""
    a = run.args
    # The rollout waits until the subscriber holds the resumed learner's
    # first version: the one the checkpoint's weights must equal.
    run.procs["rollout"].send_signal(signal.SIGSTOP)
    first = len(run.versions)  # the rows of the resumed learner follow
    run.resumed_rows = first
    run.learner(0, 1, "none")
    rehearsal_checks.fetch_resumed_snapshot(run, a.timeout_min * 60)
    # The check reads the checkpoint (seconds to minutes); the learner
    # trains on meanwhile, and its versions are sampled as they come.
    check = threading.Thread(target=rehearsal_checks.check_resumed, args=(run,))
    check.start()
    while check.is_alive():
        rehearsal_checks.poll(run)
        check.join(1.0)
    run.procs["rollout"].send_signal(signal.SIGCONT)
    deadline = time.time() + a.timeout_min * 60
    while time.time() < deadline:
        rehearsal_checks.poll(run)
        if run.procs["learner-resumed"].poll() is not None:
            run.failures.append("the resumed learner exited (see learner-resumed.log)")
            break
        if any(v["version"] >= a.steps for v in run.versions[first:]):
            break
        time.sleep(1.0)
    # The receivers take the resumed learner's versions too.
    rehearsal_checks.wait_for_receivers(run, time.time() + 180)
    run.sample()
    run.stop(["learner-resumed"], signal.SIGTERM)
    run.stop(["rollout", "group", "subscriber", "feeder"])


def main():
    args = parse_args()
    run = Run(args)
    prepare(run)
    started = time.time()
    try:
        first_leg(run)
        second_leg(run)
    finally:
        for p in run.procs.values():
            if p.poll() is None:
                p.kill()
    report = rehearsal_checks.report(run, time.time() - started)
    with open(os.path.join(args.work, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.work, "report.md"), "w") as f:
        f.write(rehearsal_checks.markdown(report))
    print(rehearsal_checks.markdown(report))
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
