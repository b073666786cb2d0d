"""Kill -9 and restart of a real asympo-learner process: the restarted
learner resumes from the newest checkpoint, and its weights are the
checkpoint's bit for bit (compared through --export_dir).

    python3 kill_restart_test.py PROTO_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc/grpc_tools are missing.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys

from learner_client import check, free_port, generate_stubs, grpc


def tensors(path):
    """name -> raw bytes of every tensor in a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def main():
    proto_dir, binary, work = sys.argv[1], sys.argv[2], sys.argv[3]
    shutil.rmtree(work, ignore_errors=True)
    learner_pb2, learner_pb2_grpc, rollout_pb2 = generate_stubs(proto_dir, work)

    ckpt, export = os.path.join(work, "ckpt"), os.path.join(work, "export")

    def start(port, extra):
        log = open(os.path.join(work, "learner-%d.log" % port), "w")
        return subprocess.Popen([binary, "--listen=127.0.0.1:%d" % port, "--metrics_address=",
                                 "--prompts_per_step=2", "--checkpoint_every=1", "--lr=1e-3",
                                 "--checkpoint_dir=" + ckpt] + extra, stdout=log, stderr=subprocess.STDOUT)

    def stub_for(port):
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        grpc.channel_ready_future(channel).result(timeout=60)
        return learner_pb2_grpc.LearnerStub(channel)

    port = free_port()
    proc = start(port, [])
    stub = stub_for(port)
    i = 0
    while stub.GetStatus(learner_pb2.GetStatusRequest()).version < 4:
        stub.Submit(rollout_pb2.RolloutBatch(groups=[rollout_pb2.PromptGroup(
            prompt_id="p%d" % i, prompt_tokens=[1, 2, 3 + i % 50], responses=[
                rollout_pb2.Response(tokens=[5 + (i + r) % 50, 9], reward=float(r == i % 3))
                for r in range(3)])]))
        i += 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))
    check(len(ckpts) >= 1, "checkpoints written before the kill: %s" % ckpts)
    newest = ckpts[-1]
    version = int(newest[5:])

    # Restart, then stop at once: the export holds the restored weights.
    port = free_port()
    proc = start(port, ["--export_dir=" + export])
    status = stub_for(port).GetStatus(learner_pb2.GetStatusRequest())
    check(status.version == version, "restart resumed version %d" % version)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")
    saved = tensors(os.path.join(ckpt, newest, "state.safetensors"))
    exported = tensors(os.path.join(export, "model.safetensors"))
    check(len(exported) > 0 and all(saved[k] == v for k, v in exported.items()),
          "restored weights equal the checkpoint's bit for bit (%d tensors)" % len(exported))
    check(any(k.startswith("__optimizer__.") for k in saved), "the checkpoint carries optimizer state")


if __name__ == "__main__":
    main()
