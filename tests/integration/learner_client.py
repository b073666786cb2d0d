"""Helpers shared by the Python integration tests: stubs generated from
proto/ with grpc_tools, a free loopback port, and a check that exits 1."""
import os
import sys

try:
    import grpc  # noqa: F401  (re-exported for the tests)
    from grpc_tools import protoc
except ImportError as e:  # pragma: no cover
    print("SKIP: python3-grpcio / python3-grpc-tools missing:", e)
    sys.exit(77)


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    print("ok:", what)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from local_run import free_port  # noqa: E402,F401  (one port is never handed out twice)


def generate_stubs(proto_dir, work):
    """Generates the Python stubs of the Learner API into `work` and returns
    (learner_pb2, learner_pb2_grpc, rollout_pb2)."""
    os.makedirs(work, exist_ok=True)
    protos = ["asympo/v1/rollout.proto", "asympo/v1/learner.proto"]
    rc = protoc.main(["protoc", "-I" + proto_dir, "--python_out=" + work, "--grpc_python_out=" + work] +
                     [os.path.join(proto_dir, p) for p in protos])
    check(rc == 0, "stubs generated from proto/")
    sys.path.insert(0, work)
    from asympo.v1 import learner_pb2, learner_pb2_grpc, rollout_pb2
    return learner_pb2, learner_pb2_grpc, rollout_pb2


def torch_or_skip():
    """torch, or exit 77 (the tests' skip code) when it is missing."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        print("SKIP: torch missing:", e)
        sys.exit(77)
    return torch


def version_feeder(asympo_rl, client):
    """new_version(): has the learner behind `client` (an
    asympo_rl.LearnerClient) train one more version on two fed groups, and
    returns once it has (60 s at most)."""
    feed = iter(range(1000000))

    def new_version():
        import time
        n, before = next(feed), client.status().version
        client.submit([asympo_rl.group([1, 4, 8 + n + g, 3], [([8 + n + g, 2], 1.0), ([9, 2], 0.0)],
                                       prompt_id="g%d-%d" % (n, g)) for g in range(2)])
        deadline = time.time() + 60
        while client.status().version == before and time.time() < deadline:
            time.sleep(0.05)
    return new_version


class RunningLearner:
    """`with RunningLearner(binary, flags, log_path, asympo_rl) as (target,
    new_version):` an asympo-learner on a free loopback port with `flags`
    (no metrics port), ready once it answers GetStatus; stopped with SIGTERM
    on leaving. new_version: version_feeder's."""

    def __init__(self, binary, flags, log_path, asympo_rl):
        self.binary, self.flags, self.log_path, self.asympo_rl = binary, flags, log_path, asympo_rl

    def __enter__(self):
        import subprocess
        target = "127.0.0.1:%d" % free_port()
        self.proc = subprocess.Popen([self.binary, "--listen=" + target, "--metrics_address="] + self.flags,
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        try:
            client = self.asympo_rl.LearnerClient(target, source="test-feeder")
            client.status(timeout=60)
        except BaseException:
            self.__exit__()
            raise
        return target, version_feeder(self.asympo_rl, client)

    def __exit__(self, *exc):
        import signal
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def on_threads(fn, items):
    """fn(item) for every item at once, one thread each, as an engine's
    collective call runs on its workers; their results in order, or the
    first error raised again."""
    import threading
    results, errors = [None] * len(items), []

    def run(i, item):
        try:
            results[i] = fn(item)
        except Exception as e:  # noqa: BLE001 - raised again below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i, x)) for i, x in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
