"""Loss masks end to end: multi-turn trajectories submitted from outside
(asympo_rl.multi_turn_response) to real asympo-learner processes, the
weights after a step read back from the learner's own export.

Three learners start from the same tiny model and take one step each
(asympo, then grpo with behavior log-probs), on batches equal but for the
tokens the environment inserted at the end of every response:

- A and B differ only in those inserted tokens: the exports are equal byte
  for byte (an inserted token's own log-prob takes no part in any
  objective, nor in ASymPO's S_g, a mean over generated tokens);
- C is A with those tokens marked generated: its export differs (the
  check can fail).
Inserted tokens in the middle of a response are conditioned on (the tokens
after them read them), so they are the same in all three.

    python3 python_loss_mask_influence_test.py PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc is missing."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

from learner_client import check, free_port

PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
try:
    import asympo_rl  # noqa: E402
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

FLAGS = ["--model=tiny", "--tiny_vocab_size=512", "--threads=1", "--prompts_per_step=2", "--seed=5",
         "--checkpoint_every=0", "--lr=1e-2"]


def batch(tail, tail_generated, logprobs):
    """Two groups of three multi-turn responses: a call, a tool's answer,
    a final turn, then `tail` (inserted, or generated when tail_generated)."""
    groups = []
    for g in range(2):
        responses = []
        for r in range(3):
            final = [40 + g, 50 + r, 2]
            segments = [asympo_rl.generated([10 + r, 11, 12], [-1.0, -1.5, -0.5] if logprobs else None),
                        asympo_rl.inserted([300 + r, 301]),
                        asympo_rl.generated(final, [-0.7] * len(final) if logprobs else None)]
            if tail_generated:
                segments.append(asympo_rl.generated(tail, [-0.9] * len(tail) if logprobs else None))
            else:
                segments.append(asympo_rl.inserted(tail))
            responses.append(asympo_rl.multi_turn_response(segments, reward=float(r == g)))
        groups.append(asympo_rl.group([1, 5 + g, 9, 3], responses, prompt_id="p%d" % g))
    return groups


def trained_export(name, objective, groups):
    """The SHA-256 of each file a fresh learner exports after one step on
    `groups`."""
    out = os.path.join(WORK, name)
    target = "127.0.0.1:%d" % free_port()
    proc = subprocess.Popen([LEARNER, "--listen=" + target, "--metrics_address=", "--objective=" + objective,
                             "--checkpoint_dir=" + os.path.join(out, "ckpt"), "--export_dir=" + os.path.join(out, "hf")]
                            + FLAGS, stdout=open(out + ".log", "w"), stderr=subprocess.STDOUT)
    try:
        client = asympo_rl.LearnerClient(target, source="masks")
        client.status(timeout=60)
        client.submit(groups)
        deadline = time.time() + 60
        while client.status(timeout=30).version < 1 and time.time() < deadline:
            time.sleep(0.05)
        check(client.status(timeout=30).version == 1, "%s: the learner trained one step" % name)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    check(proc.returncode == 0, "%s: the learner exits cleanly" % name)
    hf = os.path.join(out, "hf")
    files = sorted(f for f in os.listdir(hf) if f.endswith(".safetensors"))
    check(files, "%s: the export holds the weights (%s)" % (name, files))
    return {f: hashlib.sha256(open(os.path.join(hf, f), "rb").read()).hexdigest() for f in files}


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    for objective, logprobs in (("asympo", False), ("grpo", True)):
        a = trained_export(objective + "-a", objective, batch([7, 8], False, logprobs))
        b = trained_export(objective + "-b", objective, batch([3, 11], False, logprobs))
        c = trained_export(objective + "-c", objective, batch([7, 8], True, logprobs))
        check(a == b, "%s: responses that differ only in their inserted last tokens train to the same "
              "weights, byte for byte" % objective)
        check(a != c, "%s: the same tokens marked generated train to other weights" % objective)


if __name__ == "__main__":
    main()
