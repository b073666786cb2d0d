"""Helpers shared by the Python integration tests: stubs generated from
proto/ with grpc_tools, a free loopback port, and a check that exits 1."""
import os
import socket
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


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
