"""Admission with real processes, the setting that froze training: a learner
with --queue_capacity=8 --prompts_per_step=4 --max_groups_per_batch=8, one
asympo-rollout and one outside feeder (asympo_rl.LearnerClient) sending
batches of 1 to 8 groups. A batch of 8 fits only an empty queue, so while a
few groups are queued both senders wait for a step that needs more groups:
the learner froze at version 3 for good. Now the learner takes the groups
it holds as a short step once a submission has waited a second for room
(docs/operations.md, "Admission cannot stall the steps"): the version must
advance in every 5 s window after the first, and the feeder's batches are
all accepted.

    python3 admission_probe_test.py PKG_DIR LEARNER ROLLOUT WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc is missing."""
import os
import random
import shutil
import subprocess
import sys
import threading
import time

from learner_client import check, free_port

PKG, LEARNER, ROLLOUT, WORK = sys.argv[1:5]
sys.path.insert(0, PKG)
import asympo_rl  # noqa: E402


def feed(client, stop, errors):
    rng, i = random.Random(7), 0
    while not stop.is_set():
        groups = [{"prompt_id": "f%d_%d" % (i, g), "prompt_tokens": [1, 2, 3],
                   "responses": [{"tokens": [4 + r, 5], "reward": float(r == 0)} for r in range(4)]}
                  for g in range(rng.choice([1, 3, 5, 8]))]
        try:
            client.submit(groups)
        except asympo_rl.AsympoError as e:
            errors.append(e)
        i += 1


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    port, metrics = free_port(), free_port()
    learner = subprocess.Popen(
        [LEARNER, "--listen=127.0.0.1:%d" % port, "--metrics_address=", "--model=tiny", "--threads=1",
         "--queue_capacity=8", "--prompts_per_step=4", "--max_groups_per_batch=8"],
        stdout=open(os.path.join(WORK, "learner.log"), "w"), stderr=subprocess.STDOUT)
    rollout = subprocess.Popen(
        [ROLLOUT, "--learner=127.0.0.1:%d" % port, "--metrics_address=127.0.0.1:%d" % metrics,
         "--task=copy", "--threads=1"],
        stdout=open(os.path.join(WORK, "rollout.log"), "w"), stderr=subprocess.STDOUT)
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="feeder", retry_deadline=120)
    client.status(timeout=60)
    stop, errors = threading.Event(), []
    feeder = threading.Thread(target=feed, args=(client, stop, errors))
    feeder.start()
    versions = []
    try:
        for _ in range(5):
            time.sleep(5)
            versions.append(client.status().version)
    finally:
        stop.set()
        feeder.join(timeout=150)
        for p in (rollout, learner):
            p.terminate()
            p.wait(timeout=60)
    print("versions every 5 s:", versions)
    check(all(b > a for a, b in zip(versions, versions[1:])),
          "the version advanced in every 5 s window: %s" % versions)
    check(not errors, "every feeder batch was accepted (%s)" % errors[:3])
    check(learner.returncode == 0, "the learner exits cleanly")


if __name__ == "__main__":
    main()
