"""anonymous_peers_test.py's `shares` scenario: one principal holding
SubmitStreams, registrations or fetches up to its share does not lock out
another; Register's version and failure reports cannot skew the metrics;
without an authorizer a subscribed receiver id stays its connection's."""
import os
import sys
import threading
import time

from grpc_tools import protoc

from learner_client import check, free_port, grpc
from security_test import batch, channel, code_of, sample, scrape, start_secure_learner

TOKEN = (("authorization", "Bearer gen-token"),)
READER = (("authorization", "Bearer reader-token"),)


def weight_stubs(proto_dir, work):
    rc = protoc.main(["protoc", "-I" + proto_dir, "--python_out=" + work, "--grpc_python_out=" + work,
                      os.path.join(proto_dir, "asympo/v1/weight_broadcast.proto")])
    check(rc == 0, "weight broadcast stubs generated")
    from asympo.v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc
    return weight_broadcast_pb2, weight_broadcast_pb2_grpc


class HeldStream:
    """A SubmitStream that sends one batch and then waits."""

    def __init__(self, stub, env, tag, metadata):
        self.release = threading.Event()

        def batches():
            yield batch(env, tag, 1)
            self.release.wait()
        self.future = stub.SubmitStream.future(batches(), metadata=metadata, timeout=120)

    def end(self):
        self.release.set()
        return code_of(self.future.result)[0]


def streams(env, metrics_port, gen, rollouts):
    held = [HeldStream(gen, env, "held%d-" % i, TOKEN) for i in range(2)]
    # Both held streams open on the learner (each had its batch accepted)
    # before the third: under load a third stream could otherwise arrive
    # first, take a slot, and wait for its end instead of being refused.
    deadline = time.time() + 30
    while sample(scrape(metrics_port), "asympo_learner_batches_total", result="accepted") < 2:
        check(time.time() < deadline, "the two held SubmitStreams had their batches accepted")
        time.sleep(0.05)
    extra = HeldStream(gen, env, "extra-", TOKEN)
    got, details = code_of(lambda: extra.future.result(timeout=30))
    check(got == grpc.StatusCode.RESOURCE_EXHAUSTED and "SubmitStreams open" in details,
          "gen's third SubmitStream: RESOURCE_EXHAUSTED at its share of 2 (%s)" % details)
    other = HeldStream(rollouts, env, "other-", ())
    check(other.end() == grpc.StatusCode.OK, "another principal's SubmitStream is served meanwhile")
    check(all(h.end() == grpc.StatusCode.OK for h in held), "gen's held streams end normally")


def registrations_and_fetches(env, port, wb, wb_grpc, signature):
    # Without BDP probing the client's window stays 64 KiB: a fetch of 64 KiB
    # chunks that is not read stays under way.
    creds = grpc.ssl_channel_credentials(root_certificates=env.read("ca.pem"))
    reader = wb_grpc.WeightBroadcastStub(grpc.secure_channel(
        "127.0.0.1:%d" % port, creds, options=[("grpc.http2.bdp_probe", 0)]))
    rollouts = wb_grpc.WeightBroadcastStub(channel(env, port, "client"))

    def register(stub, rid, md=READER, version=0):
        return stub.Register(wb.RegisterRequest(receiver_id=rid, model_signature=signature,
                                                current_version=version), metadata=md, timeout=30)
    sessions = [register(reader, "r%d" % i) for i in range(3)]
    got, details = code_of(lambda: register(reader, "r3"))
    check(got == grpc.StatusCode.RESOURCE_EXHAUSTED, "reader's fourth registration: "
          "RESOURCE_EXHAUSTED at its share of 3 (%s)" % details)
    mine = register(rollouts, "rollout-x", md=())
    check(mine.session_id != "", "another principal registers meanwhile")
    latest = mine.latest_version
    fetch = lambda stub, s, md: stub.FetchSnapshot(wb.FetchSnapshotRequest(  # noqa: E731
        session_id=s.session_id, version=latest, max_chunk_bytes=65536), metadata=md, timeout=60)
    held = [fetch(reader, sessions[0], READER) for _ in range(2)]
    for h in held:
        next(h)  # under way, then never read again
    got, details = code_of(lambda: next(fetch(reader, sessions[1], READER)))
    check(got == grpc.StatusCode.RESOURCE_EXHAUSTED, "reader's third fetch: RESOURCE_EXHAUSTED "
          "at its share of 2 (%s)" % details)
    chunk = next(fetch(rollouts, mine, ()))
    check(chunk.version == latest, "another principal fetches meanwhile")
    for h in held:
        h.cancel()
    return reader, rollouts, register, sessions


def metrics_stay_sane(wb, reader, register, metrics_port, sessions):
    liar = register(reader, "r1", version=2 ** 63)
    stream = reader.Subscribe(wb.SubscribeRequest(session_id=liar.session_id), metadata=READER,
                              timeout=60)
    next(stream)
    oldest = sample(scrape(metrics_port), "asympo_broadcast_oldest_receiver_version")
    check(oldest < 2 ** 62, "Register with current_version 2^63: the oldest receiver version "
          "stays %s" % oldest)
    stream.cancel()
    before = sample(scrape(metrics_port), "asympo_broadcast_failures_total")
    for _ in range(101):
        reader.ReportVersion(wb.ReportVersionRequest(session_id=sessions[0].session_id,
                                                     version=0, error="fake"),
                             metadata=READER, timeout=30)
    after = sample(scrape(metrics_port), "asympo_broadcast_failures_total")
    check(after - before == 1, "101 failure reports of one session count once (%d)" % (after - before))


def hijack(env, wb, wb_grpc):
    """No authorizer: a subscribed receiver id is its connection's."""
    port = free_port()
    env.run_learner(["--listen=127.0.0.1:%d" % port, "--metrics_address="], "anonymous")
    opts = [("grpc.use_local_subchannel_pool", 1)]
    owner = wb_grpc.WeightBroadcastStub(grpc.insecure_channel("127.0.0.1:%d" % port, opts))
    other = wb_grpc.WeightBroadcastStub(grpc.insecure_channel("127.0.0.1:%d" % port, opts))
    status = env.pb2_grpc.LearnerStub(grpc.insecure_channel("127.0.0.1:%d" % port)).GetStatus(
        env.pb2.GetStatusRequest(), wait_for_ready=True, timeout=60)
    req = wb.RegisterRequest(receiver_id="victim", model_signature=status.model_signature)
    mine = owner.Register(req, timeout=30)
    stream = owner.Subscribe(wb.SubscribeRequest(session_id=mine.session_id), timeout=60)
    next(stream)
    got, details = code_of(lambda: other.Register(req, timeout=30))
    check(got == grpc.StatusCode.PERMISSION_DENIED and "another connection" in details,
          "no authorizer: another connection cannot take a subscribed receiver id (%s)" % details)
    stream.cancel()


def run(env):
    proto_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
    wb, wb_grpc = weight_stubs(proto_dir, env.work)
    port, metrics_port = start_secure_learner(env, [
        "--prompts_per_step=64",  # no step: the latest version stays put
        "--max_submit_streams=8", "--max_streams_per_principal=2",
        "--max_registrations_per_principal=3", "--max_fetches_per_principal=2"])
    gen = env.pb2_grpc.LearnerStub(channel(env, port))
    rollouts = env.pb2_grpc.LearnerStub(channel(env, port, "client"))
    signature = gen.GetStatus(env.pb2.GetStatusRequest(), metadata=TOKEN, timeout=30).model_signature
    streams(env, metrics_port, gen, rollouts)
    reader, _, register, sessions = registrations_and_fetches(env, port, wb, wb_grpc, signature)
    metrics_stay_sane(wb, reader, register, metrics_port, sessions)
    env.stop_all()
    hijack(env, wb, wb_grpc)
    env.stop_all()


if __name__ == "__main__":
    sys.exit("run through anonymous_peers_test.py shares")
