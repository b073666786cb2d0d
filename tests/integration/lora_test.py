"""Low-rank adapters with real processes on loopback (asympo-learner and
asympo-rollout with --lora_rank). Scenarios:

  train   a learner training rank-4 adapters and two rollouts sampling with
          them, versions in bfloat16: versions reach both rollouts and their
          groups train the learner; the checkpoint holds the adapters alone (float32, with
          AdamW moments) and names its base; a rollout without adapters is
          refused the learner's versions, saying why.
  group   the learner's weight group (--weight_group=gloo) delivers a
          version of the adapters alone to a WeightGroupReceiver, byte for
          byte the gRPC fetch of the same version.
  resume  the learner resumes its adapters from the checkpoint; the version
          it publishes, fetched over gRPC (asympo_rl.WeightSubscriber), is
          the checkpoint's adapters byte for byte, and its export is the
          merged model: the base plus alpha / rank * B A of the fetched
          adapters (the base from a learner without adapters that exports
          the same base);
          a learner with another base (another --seed of the tiny model)
          refuses the checkpoint and exits, naming both bases.

    python3 lora_test.py SCENARIO PROTO_DIR PKG_DIR LEARNER_BINARY ROLLOUT_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc/grpc_tools are missing.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np

from learner_process_test import Learner, tensors
from rollout_loop_test import Cluster, check, run_scenario, wait_for

LORA = ["--lora_rank=4", "--lora_alpha=8"]
SCALE = 8 / 4


def newest_checkpoint(root):
    ckpts = sorted(d for d in os.listdir(root) if d.startswith("ckpt-"))
    check(len(ckpts) >= 1, "checkpoints under %s: %s" % (root, ckpts))
    return os.path.join(root, ckpts[-1])


def check_adapter_checkpoint(path):
    saved = tensors(os.path.join(path, "shard-00000-of-00001.safetensors"))
    weights = [k for k in saved if k.startswith("weight/")]
    check(len(weights) > 0 and all(".lora_A." in k or ".lora_B." in k for k in weights),
          "the checkpoint holds adapters alone (%d tensors, e.g. %s)" % (len(weights), weights[0]))
    check(any(k.startswith("exp_avg/") for k in saved), "and their AdamW moments")
    with open(os.path.join(path, "meta.json")) as f:
        base = json.load(f).get("base", {})
    check(base.get("path") == "tiny" and len(base.get("crc32c", "")) == 8,
          "meta.json names the base: %s" % base)
    return saved


def scenario_train(c):
    # Versions in bfloat16, as on a GPU: the rollouts' float32 adapters
    # take them (their signature is their dtype's, like the weights').
    bf16 = ["--dtype=bfloat16"]
    c.start_learner(LORA + bf16)
    c.start_rollout(0, LORA + bf16)
    c.start_rollout(1, LORA + bf16)
    wait_for("the learner trains 6 steps on the rollouts' groups", lambda: c.version() >= 6,
             timeout=120)
    wait_for("both rollouts sample with a version >= 3",
             lambda: min(c.rollout_version(0), c.rollout_version(1)) >= 3)
    c.stop("rollout-1")
    # A rollout without adapters cannot take the learner's versions.
    c.start_rollout(1, bf16)
    log = os.path.join(c.work, "rollout-1.log")
    wait_for("a rollout without --lora_rank is refused the adapters' versions",
             lambda: "with the same adapters" in open(log).read(), timeout=60)
    c.stop_all()
    check_adapter_checkpoint(newest_checkpoint(os.path.join(c.work, "ckpt")))


def fetched_adapters(learner, port, version, saved):
    """The learner's current version over gRPC: version `version`, the
    checkpoint's adapters byte for byte. Returns name -> float32 array."""
    import asympo_rl
    sub = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="lora-test")
    snapshot = next(sub.snapshots())
    sub.close()
    check(snapshot.version == version, "the fetched version is the resumed one (%d)" % version)
    got = snapshot.state_dict("numpy")
    check(sorted("weight/%s/0" % k for k in got) == sorted(k for k in saved if k.startswith("weight/")),
          "the version carries the adapters alone (%d tensors)" % len(got))
    check(all(got[k].tobytes() == saved["weight/%s/0" % k] for k in got),
          "and they are the checkpoint's, byte for byte")
    return got


def merged_check(base_export, export, adapters):
    base = tensors(os.path.join(base_export, "model.safetensors"))
    merged = tensors(os.path.join(export, "model.safetensors"))
    check(sorted(base) == sorted(merged), "the export has the base's names (%d)" % len(merged))
    worst, moved = 0.0, 0
    for name, raw in merged.items():
        w = np.frombuffer(base[name], dtype=np.float32)
        got = np.frombuffer(raw, dtype=np.float32)
        module = name[:-len(".weight")]
        a = adapters.get("%s.lora_A.weight" % module)
        if a is None:
            check(np.array_equal(w, got), "%s (no adapter) is the base's" % name, quiet=True)
            continue
        a, b = a.ravel(), adapters["%s.lora_B.weight" % module].ravel()
        out, rank = w.size // (a.size // 4), 4
        want = w.reshape(out, -1) + SCALE * b.reshape(out, rank) @ a.reshape(rank, -1)
        worst = max(worst, float(np.abs(want.ravel() - got).max()))
        moved += int(not np.array_equal(w, got))
    check(worst <= 1e-5 and moved > 0,
          "the export is the base plus alpha / rank * B A (max |diff| %.2g; %d weights moved)"
          % (worst, moved))


def scenario_group(learner):
    import asympo_rl
    import torch
    from rollout_loop_test import free_port
    port = free_port()
    proc = learner.start(port, LORA + ["--weight_group=gloo", "--weight_group_address=127.0.0.1",
                                       "--weight_group_timeout=10s", "--weight_group_ready_timeout=10s",
                                       "--weight_group_join_window=1s"])
    try:
        target = "127.0.0.1:%d" % port
        learner.stub_for(port)
        rx = asympo_rl.WeightGroupReceiver(target, "lora-group", gloo_address="127.0.0.1",
                                           next_wait_ms=1000)
        update = next(rx.updates())
        check(update.ok, "a version arrived over the weight group (version %d)" % update.version)
        group = {name: t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                 for name, t in update}
        rx.close()
        sub = asympo_rl.WeightSubscriber(target, receiver_id="lora-group-check")
        snapshot = next(sub.snapshots())
        sub.close()
        check(snapshot.version == update.version, "the gRPC fetch is the same version")
        fetched = {name: t.tobytes() for name, t in snapshot.tensors("numpy")}
        check(len(group) > 0 and all(".lora_A." in k or ".lora_B." in k for k in group),
              "the group's version carries the adapters alone (%d tensors)" % len(group))
        check(group == fetched, "byte for byte the gRPC fetch's")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def scenario_resume(learner):
    from rollout_loop_test import free_port
    port = free_port()
    proc = learner.start(port, LORA)
    learner.feed_until(learner.stub_for(port), 4)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit after 4 steps")
    path = newest_checkpoint(learner.ckpt)
    saved = check_adapter_checkpoint(path)
    version = int(os.path.basename(path)[5:])

    export = os.path.join(learner.work, "export")
    port = free_port()
    proc = learner.start(port, LORA + ["--export_dir=" + export])
    status = learner.stub_for(port).GetStatus(learner.pb2.GetStatusRequest())
    check(status.version == version, "the restarted learner resumed version %d" % version)
    adapters = fetched_adapters(learner, port, version, saved)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")
    # The same base without adapters, exported as it starts (no checkpoint).
    base_export = os.path.join(learner.work, "base")
    port = free_port()
    proc = subprocess.Popen([learner.binary, "--listen=127.0.0.1:%d" % port,
                             "--export_dir=" + base_export], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    learner.stub_for(port)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "the base alone exports")
    merged_check(base_export, export, adapters)

    port = free_port()
    proc = learner.start(port, LORA + ["--seed=1"])
    rc = proc.wait(timeout=60)
    text = open(learner.log_path).read()
    check(rc != 0 and "adapters trained on the base tiny" in text and "this learner's base" in text,
          "a learner with another base refuses the checkpoint (exit %d)" % rc)


def main():
    scenario, proto_dir, pkg_dir, learner_bin, rollout_bin, work = sys.argv[1:7]
    sys.path.insert(0, pkg_dir)
    work = os.path.join(work, scenario)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if scenario == "train":
        c = Cluster(learner_bin, rollout_bin, work)
        run_scenario(c, scenario, lambda: scenario_train(c))
    elif scenario in ("resume", "group"):
        {"resume": scenario_resume, "group": scenario_group}[scenario](
            Learner(proto_dir, learner_bin, work))
        print("PASS", scenario)
    else:
        check(False, "scenario %s is train, resume or group" % scenario)


if __name__ == "__main__":
    main()
