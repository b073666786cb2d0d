"""Every program refuses a bad flag before anything binds or starts: exit 2
and a message "--FLAG=VALUE: what is wrong" on stderr. The daemons are
given a metrics port this test holds: a daemon that got as far as serving
/metrics would fail on that port instead, and name it. Nothing is logged
as listening or serving. asympo-submit is given a learner address on which
nothing answers and a short --timeout: it must not try it.

    python3 start_checks_test.py BUILD_DIR WORK_DIR
Exit 0 on success, 1 on a failed case.
"""
import os
import shutil
import socket
import subprocess
import sys


def main():
    build, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    learner = os.path.join(build, "learner_server", "asympo-learner")
    rollout = os.path.join(build, "rollout_server", "asympo-rollout")
    evaluator = os.path.join(build, "rollout_server", "asympo-eval")
    submit = os.path.join(build, "rollout_server", "asympo-submit")
    plan = os.path.join(build, "learner_server", "asympo-plan")
    held = socket.socket()  # the metrics port: busy for anyone else
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    metrics = "--metrics_address=127.0.0.1:%d" % held.getsockname()[1]
    groups = os.path.join(work, "groups.jsonl")
    open(groups, "w").close()
    not_a_dir = os.path.join(work, "file")
    open(not_a_dir, "w").close()
    daemon_learner = [learner, metrics, "--listen=127.0.0.1:0"]
    daemon_rollout = [rollout, metrics]
    cases = [
        (daemon_learner + ["--listen="], "--listen=: is empty"),
        (daemon_learner + ["--listen=localhost"], "--listen=localhost: has no port"),
        (daemon_learner + ["--listen=0.0.0.0:0"], "--listen=0.0.0.0:0: refusing to listen"),
        (daemon_learner + ["--batch_id_window=4", "--queue_capacity=64"],
         "--batch_id_window=4 is below --queue_capacity=64"),
        (daemon_learner + ["--prompts_per_step=100", "--queue_capacity=10"],
         "--queue_capacity=10 is below --prompts_per_step=100"),
        (daemon_learner + ["--dist_shard=full"], "--dist_shard=full with a world of 1 rank"),
        (daemon_learner + ["--model=/nonexistent"], "--model=/nonexistent: not a directory"),
        (daemon_learner + ["--auth_file=/nonexistent"], "--auth_file=/nonexistent: cannot be read"),
        (daemon_learner + ["--checkpoint_dir=" + not_a_dir + "/ckpt"],
         "--checkpoint_dir=" + not_a_dir + "/ckpt cannot be written"),
        ([learner, "--metrics_address=localhost"], "--metrics_address=localhost: has no port"),
        (daemon_learner + ["--lr_schedule=linear"], "--lr_schedule=linear: expected constant"),
        (daemon_learner + ["--lr_schedule=cosine"],
         "--lr_schedule=cosine needs --total_steps=0 above --warmup_steps=0"),
        (daemon_learner + ["--logprob_chunk_rows=0"], "--logprob_chunk_rows=0: expected 1 to"),
        (daemon_rollout + ["--task=nope"], "--task=nope: no such task"),
        (daemon_rollout + ["--learner="], "--learner=: is empty"),
        (daemon_rollout + ["--learner=localhost"], "--learner=localhost: has no port"),
        (daemon_rollout + ["--id="], "--id=: it must have 1 to 128 bytes"),
        (daemon_rollout + ["--id=" + "x" * 129], "it must have 1 to 128 bytes (has 129)"),
        (daemon_rollout + ["--min_backoff=10s", "--max_backoff=1s"],
         "--min_backoff=10s and --max_backoff=1s"),
        (daemon_rollout + ["--batching=static", "--max_buffered_groups=2",
                           "--prompts_per_generation=8"],
         "--max_buffered_groups=2 is below --prompts_per_generation=8"),
        ([submit, "--learner=localhost", "--input=" + groups, "--timeout=1s"],
         "--learner=localhost: has no port"),
        ([submit, "--learner=", "--input=" + groups, "--timeout=1s"], "--learner=: is empty"),
        ([submit, "--confirm=maybe", "--input=" + groups], "--confirm=maybe: expected"),
        ([evaluator, "--task=nope", "--checkpoint=/nonexistent"], "--task=nope: no such task"),
        ([plan, "--model=qwen3-0.6b", "--dist_shard=full"],
         "--dist_shard=full with a world of 1 rank"),
    ]
    fails = 0
    for args, want in cases:
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            rc, err = "timeout", ""
        started = [line for line in err.splitlines()
                   if "metrics at http" in line or "listening on" in line or "ready:" in line]
        line = " ".join(os.path.basename(args[0]) if i == 0 else a for i, a in enumerate(args))
        if rc != 2 or want not in err or started:
            print("FAIL: %s: exit %s, want 2 and %r before anything starts; stderr: %s" % (
                line, rc, want, err[-600:]))
            fails += 1
        else:
            print("ok: %s -> %s" % (line, want))
    held.close()
    print("PASS" if fails == 0 else "%d failed" % fails)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
