"""The generated asympo.v1 modules (asympo_rl/v1, made by setup.py at build
time from proto/)."""
try:
    from .v1 import learner_pb2, learner_pb2_grpc, rollout_pb2  # noqa: F401
    from .v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc  # noqa: F401
    from .v1 import environment_pb2, environment_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError("asympo_rl's gRPC stubs are missing (%s): install the package with "
                      "'pip install --no-build-isolation ./proto/python', which generates them "
                      "from proto/" % e) from e
