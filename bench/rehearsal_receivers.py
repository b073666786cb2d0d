"""The rehearsal's outside processes (bench/rehearsal.py), each a process
of its own using the Python package:

    rehearsal_receivers.py group TARGET OUT.jsonl      a weight-group worker (Gloo)
    rehearsal_receivers.py subscriber TARGET OUT.jsonl  a gRPC weight subscriber
    rehearsal_receivers.py once TARGET OUT.jsonl        a new subscriber's first snapshot
    rehearsal_receivers.py feeder TARGET OUT.jsonl      an outside generator's groups
    rehearsal_receivers.py base - OUT.jsonl             a receiver's memory before any weights

Each writes one JSON line per version it takes: the version, the bytes, the
seconds from asking to holding every tensor, and (subscriber) the SHA-256 of
every tensor's bytes, for the rehearsal's check that a resumed learner
publishes the checkpoint's weights. Runs until killed."""
import hashlib
import json
import sys
import time


def run_group(target, out):
    from asympo_rl.errors import WeightsError
    from asympo_rl.weight_group import WeightGroupReceiver
    receiver = WeightGroupReceiver(target, "rehearsal-group-worker", backend="gloo",
                                   fetch_timeout=1800.0, join_wait_ms=30000)
    while True:
        start = time.monotonic()
        update = receiver.next_update()
        if update is None:
            continue
        nbytes, error = 0, ""
        try:
            with update:
                for _, tensor in update:
                    nbytes += tensor.numel() * tensor.element_size()
        except WeightsError as e:  # the version cannot be completed: the next one will
            error = str(e)
        write(out, {"version": update.version, "incarnation": update.incarnation, "bytes": nbytes,
                    "seconds": time.monotonic() - start, "time": time.time(), "error": error,
                    "fetched_buckets": update.fetched, "complete": update.complete,
                    "transfer_s": time.monotonic() - update.started_at,
                    "largest_bucket": max((b.size_bytes for b in update.manifest.buckets), default=0),
                    "deltas": receiver.deltas})


def run_subscriber(target, out, once=False):
    from asympo_rl.weights import WeightSubscriber
    subscriber = WeightSubscriber(target, "rehearsal-" + ("once" if once else "subscriber"),
                                  fetch_timeout=1800.0)
    start = time.monotonic()
    for snapshot in subscriber.snapshots():
        digests, nbytes = {}, 0
        # Each tensor's bytes as they came (no copy of the snapshot).
        for t in snapshot.manifest.tensors:
            raw = memoryview(snapshot.buckets[t.bucket])[t.offset:t.offset + t.size_bytes]
            digests[t.name] = hashlib.sha256(raw).hexdigest()
            nbytes += t.size_bytes
        subscriber.report(snapshot.version)
        write(out, {"version": snapshot.version, "incarnation": snapshot.incarnation,
                    "bytes": nbytes, "seconds": time.monotonic() - start, "time": time.time(),
                    "fetch_s": snapshot.fetch_seconds, "from_delta": snapshot.from_delta,
                    "deltas": subscriber.deltas, "sha256": digests,
                    "largest_bucket": max((b.size_bytes for b in snapshot.manifest.buckets), default=0)})
        if once:
            return
        # An engine holds one version, not two, while the next arrives (a
        # memoryview holds its bytes too).
        snapshot = raw = None
        start = time.monotonic()


def run_feeder(target, out):
    """A group every 10 s whose two responses earn 1 and 0 (a random model
    earns 0 on every built-in task, so without these no step would move
    the weights)."""
    import random
    from asympo_rl.client import LearnerClient
    from asympo_rl._stubs import rollout_pb2
    client = LearnerClient(target, source="rehearsal-feeder", retry_deadline=3600.0)
    rng = random.Random(5)
    while True:
        responses = [rollout_pb2.Response(tokens=[rng.randrange(3, 60) for _ in range(12)],
                                          reward=float(r == 0)) for r in range(2)]
        group = rollout_pb2.PromptGroup(prompt_tokens=[rng.randrange(3, 60) for _ in range(8)],
                                        responses=responses)
        r = client.submit([group])
        write(out, {"batch": r.batch_id, "learner_version": r.learner_version, "time": time.time()})
        time.sleep(10)


def run_base(target, out):
    """The memory of a receiver before it holds any weights: this
    interpreter with the package and its imports (torch, numpy, grpc)."""
    import importlib
    for name in ("asympo_rl", "asympo_rl.weight_group", "grpc", "numpy", "torch"):
        importlib.import_module(name)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    write(out, {"python_base_bytes": hwm})


def write(out, row):
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def main():
    role, target, out = sys.argv[1], sys.argv[2], sys.argv[3]
    if role == "once":
        run_subscriber(target, out, once=True)
        return
    {"group": run_group, "subscriber": run_subscriber, "feeder": run_feeder,
     "base": run_base}[role](target, out)


if __name__ == "__main__":
    main()
