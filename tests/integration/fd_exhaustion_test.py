"""asympo-learner out of file descriptors: started with RLIMIT_NOFILE
1024:1024, it gets 1,100 idle TCP connections on its gRPC port. While they
are open a new client fails fast (the learner does not leave it hanging);
once they are closed, GetStatus and Submit succeed again within seconds, a
step trains and checkpoints, and SIGTERM writes the final checkpoint and
exits 0 with no .tmp-ckpt-* directory left behind. /metrics shows the
limit (the soft RLIMIT_NOFILE less 128) and the connections refused at it.
A second learner with --max_connections=3 keeps at most 3 open and counts
the others it closes (idle ones, which never made a call, give their
place to newcomers); --max_connections=-1 is refused at start.

gRPC 1.51's own listener stopped accepting for good after one failed
accept4 (EMFILE): every later client timed out.

    python3 fd_exhaustion_test.py PROTO_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc/grpc_tools are missing
or this process cannot hold the connections.
"""
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

from learner_client import check, free_port, generate_stubs, grpc

# The launcher's /metrics scrape, which leaves out the run label.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
import local_run  # noqa: E402

LEARNER_NOFILE = 1024
IDLE_CONNECTIONS = 1100


def limit_descriptors():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LEARNER_NOFILE, LEARNER_NOFILE))


def open_idle_connections(port, count):
    """`count` TCP connections to the port that send nothing; connect()
    completes in the kernel (the listen backlog) whether or not the learner
    accepts them."""
    conns = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as e:
            s.close()
            print("connection %d not made: %s" % (len(conns), e))
            break
        conns.append(s)
    return conns


def call_within(what, seconds, call):
    """Calls `call` on fresh channels until it succeeds or `seconds` pass;
    returns (result, seconds taken)."""
    t0 = time.time()
    last = None
    while time.time() - t0 < seconds:
        try:
            return call(), time.time() - t0
        except grpc.RpcError as e:
            last = e
            time.sleep(0.1)
    check(False, "%s within %d s (last error: %s %s)" % (
        what, seconds, last.code() if last else None, last.details() if last else None))


def batch(rollout_pb2, tag, groups):
    return rollout_pb2.RolloutBatch(source="fd-exhaustion-test", batch_id="fdx/" + tag, groups=[
        rollout_pb2.PromptGroup(prompt_id="%s%d" % (tag, g), prompt_tokens=[1, 2, 3 + g], responses=[
            rollout_pb2.Response(tokens=[5 + g + r, 9], reward=float(r == g % 3)) for r in range(3)])
        for g in range(groups)])


def main():
    proto_dir, binary, work = sys.argv[1:4]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE_CONNECTIONS + 256
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            print("SKIP: this process may open %d descriptors, the test needs %d" % (hard, need))
            sys.exit(77)
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    shutil.rmtree(work, ignore_errors=True)
    learner_pb2, learner_pb2_grpc, rollout_pb2 = generate_stubs(proto_dir, work)
    ckpt = os.path.join(work, "ckpt")
    port, metrics_port = free_port(), free_port()
    log_path = os.path.join(work, "learner.log")
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:%d" % port,
                             "--metrics_address=127.0.0.1:%d" % metrics_port,
                             "--prompts_per_step=2", "--checkpoint_every=1", "--lr=1e-3",
                             "--checkpoint_dir=" + ckpt],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            preexec_fn=limit_descriptors)
    try:
        run(proc, port, metrics_port, learner_pb2, learner_pb2_grpc, rollout_pb2, ckpt, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    set_limit(binary, work, learner_pb2, learner_pb2_grpc)


def scrape(metrics_port):
    """{name{labels}: value} of the learner's /metrics, without the run label."""
    samples = local_run.scrape(metrics_port, timeout=10)
    check(samples is not None, "/metrics answers")
    return samples


def set_limit(binary, work, learner_pb2, learner_pb2_grpc):
    """--max_connections: validated, and a limit of 3 holds."""
    bad = subprocess.run([binary, "--max_connections=-1", "--metrics_address="],
                         capture_output=True, text=True, timeout=60)
    check(bad.returncode != 0 and "--max_connections=-1" in bad.stderr,
          "--max_connections=-1 is refused at start, naming the flag")
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:%d" % port, "--max_connections=3",
                             "--metrics_address=127.0.0.1:%d" % metrics_port],
                            stdout=open(os.path.join(work, "learner-limit.log"), "w"),
                            stderr=subprocess.STDOUT)
    try:
        call_within("the learner with --max_connections=3 answers", 60, lambda: stub(
            learner_pb2_grpc, port).GetStatus(learner_pb2.GetStatusRequest(), timeout=2))
        conns = open_idle_connections(port, 5)
        closed = 0
        for s in conns:
            s.settimeout(2)
            try:
                while s.recv(4096) != b"":  # past what gRPC sent an admitted one
                    pass
                closed += 1
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass
        check(wait_for("refusals counted", 10, lambda: turned_away(scrape(metrics_port)) >= 2),
              "the connections beyond 3 are counted as refused_at_limit or "
              "closed_unauthenticated (an idle one gave its place)")
        samples = scrape(metrics_port)
        check(samples.get("asympo_learner_max_connections") == 3,
              "asympo_learner_max_connections is 3")
        check(closed >= 2, "at least 2 of 5 idle connections were closed within 2 s (%d)" % closed)
        for s in conns:
            s.close()
    finally:
        proc.kill()
        proc.wait()


def turned_away(samples):
    """Connections closed by the listener: refused at a limit, or closed for
    want of an authorized call (an idle one gives its place to a newcomer)."""
    return sum(samples.get('asympo_learner_connections_total{result="%s"}' % r, 0) for r in
               ["refused_at_limit", "refused_at_peer_limit", "closed_unauthenticated"])


def stub(learner_pb2_grpc, port):
    """A stub on a connection of its own: gRPC would otherwise share one
    connection between the channels to the same address."""
    channel = grpc.insecure_channel("127.0.0.1:%d" % port,
                                    options=[("grpc.use_local_subchannel_pool", 1)])
    return learner_pb2_grpc.LearnerStub(channel)


def wait_for(what, seconds, cond):
    deadline = time.time() + seconds
    while not cond():
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def unfinished(ckpt):
    return [d for d in os.listdir(ckpt) if d.startswith(".tmp-ckpt-")] if os.path.isdir(ckpt) else []


def run(proc, port, metrics_port, learner_pb2, learner_pb2_grpc, rollout_pb2, ckpt, log_path):
    failed = []

    def expect(cond, what):
        """A check whose failure is reported at the end, so that one run
        shows every symptom."""
        print(("ok: " if cond else "FAIL (at the end): ") + what)
        if not cond:
            failed.append(what)

    # A connection made before the flood: the learner keeps serving it.
    held = stub(learner_pb2_grpc, port)
    call_within("the learner answers GetStatus", 60,
                lambda: held.GetStatus(learner_pb2.GetStatusRequest(), timeout=2))
    version = lambda: held.GetStatus(learner_pb2.GetStatusRequest(), timeout=5).version

    conns = open_idle_connections(port, IDLE_CONNECTIONS)
    check(len(conns) == IDLE_CONNECTIONS, "%d idle connections open" % len(conns))
    time.sleep(2)  # the learner takes what it can of them
    t0 = time.time()
    try:
        stub(learner_pb2_grpc, port).GetStatus(learner_pb2.GetStatusRequest(), timeout=10)
        outcome = "OK"
    except grpc.RpcError as e:
        outcome = e.code()
    took = time.time() - t0
    expect(outcome != grpc.StatusCode.DEADLINE_EXCEEDED and took < 5,
           "while they are open a new client is not left hanging (%s after %.2f s)" % (outcome, took))
    # A step while they are open: its checkpoint must find descriptors.
    held.Submit(batch(rollout_pb2, "a", 2), timeout=10)
    check(wait_for("step 1", 60, lambda: version() >= 1), "a step trained while they are open")
    expect(wait_for("checkpoint 1", 30, lambda: os.path.isdir(os.path.join(ckpt, "ckpt-%012d" % 1))),
           "its checkpoint was written while they are open")
    expect(not unfinished(ckpt), "no unfinished checkpoint left behind: %s" % unfinished(ckpt))
    check(proc.poll() is None, "the learner is still running")

    for s in conns:
        s.close()
    _, after = call_within("GetStatus after the connections closed", 5, lambda: stub(
        learner_pb2_grpc, port).GetStatus(learner_pb2.GetStatusRequest(), timeout=2))
    print("GetStatus answered %.2f s after the connections closed" % after)
    reply, _ = call_within("Submit after the connections closed", 5, lambda: stub(
        learner_pb2_grpc, port).Submit(batch(rollout_pb2, "b", 2), timeout=5))
    check(reply.accepted_groups == 2, "the learner took the batch's 2 groups")
    check(wait_for("step 2", 60, lambda: version() >= 2), "a step trained on them")
    check(wait_for("checkpoint 2", 30, lambda: os.path.isdir(os.path.join(ckpt, "ckpt-%012d" % 2))),
          "its checkpoint was written")

    samples = scrape(metrics_port)
    limit = samples.get("asympo_learner_max_connections")
    expect(limit == LEARNER_NOFILE - 128, "/metrics: the default limit is %s (ulimit -n %d less 128)"
           % (limit, LEARNER_NOFILE))
    accepted = samples.get('asympo_learner_connections_total{result="accepted"}', 0)
    refused = turned_away(samples)
    expect(refused >= IDLE_CONNECTIONS - limit and accepted + refused >= IDLE_CONNECTIONS,
           "/metrics: %d connections accepted, %d refused at a limit or closed idle" % (
               accepted, refused))

    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    log = open(log_path).read()
    check(rc == 0, "SIGTERM: the learner checkpoints and exits 0 (exit %d; log tail: %s)" % (
        rc, log[-2000:]))
    check(not unfinished(ckpt), "no unfinished checkpoint left behind: %s" % unfinished(ckpt))
    check("Failed accept4" not in log, "gRPC's listener never gave up (no 'Failed accept4')")
    check("refused" in log, "the learner logged the refused connections")
    check(not failed, "every check above passed (failed: %s)" % failed)


if __name__ == "__main__":
    main()
