#!/usr/bin/env python3
"""Nothing for anonymous peers, fair shares for the rest: a learner with
TLS, mTLS and tokens (security_test.py's), attacked from loopback.

  memory       48 anonymous Submits of 60 MB (gRPC clients) and 60 raw
               HTTP/2 messages of 60 MB left one byte short: refused on
               their headers, the learner stays under 400 MiB resident; a
               plaintext learner with tokens (loopback) refuses the short
               messages on their headers too
  connections  an outsider holds TLS+HTTP/2 connections from two addresses
               (127.0.0.1 and 127.0.0.2): at most --max_connections_per_peer
               of one address stay open, a token holder is served within
               seconds meanwhile, and connections without an authorized
               call are closed after --connection_auth_grace
  shares       one principal holding SubmitStreams, registrations or
               fetches up to its share does not lock out another; a Register
               claiming version 2^63 and 101 failure reports leave the
               gauges sane; without an authorizer, another connection cannot
               take over a subscribed receiver id

anonymous_peers_test.py SCENARIO PROTO_DIR LEARNER ROLLOUT MAKE_CERTS WORK"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import raw_http2  # noqa: E402
from learner_client import check, free_port, grpc  # noqa: E402
from security_test import (batch, channel, code_of, resident_mib, run_scenario,  # noqa: E402
                           sample, scrape, start_secure_learner, watch_peak)

MB60 = 60 * 1000 * 1000
SUBMIT = "/asympo.v1.Learner/Submit"
TOKEN = (("authorization", "Bearer gen-token"),)


def wait_serving(env, port, tls=True):
    ch = channel(env, port) if tls else grpc.insecure_channel("127.0.0.1:%d" % port)
    stub = env.pb2_grpc.LearnerStub(ch)
    stub.GetStatus(env.pb2.GetStatusRequest(), metadata=TOKEN, wait_for_ready=True, timeout=60)
    return stub


def short_messages(port, tls, count, per_connection, hold_s, metadata=()):
    """`count` Submits of 60 MB left one byte short, `per_connection` streams
    per connection, held `hold_s` seconds; returns (bytes sent, streams
    reset by the learner)."""
    conns = [raw_http2.Connection(port, tls) for _ in range((count + per_connection - 1) // per_connection)]
    calls = []
    for i in range(count):
        c = conns[i // per_connection]
        calls.append((c, c.start_call(SUBMIT, metadata)))
    sent = [0]

    def drive(c, sids):
        deadline = time.time() + hold_s
        for sid in sids:
            sent[0] += c.send_message_short(sid, MB60, deadline)
        while time.time() < deadline and not c.closed:
            c.pump(0.2)
    threads = [threading.Thread(target=drive, args=(c, [s for cc, s in calls if cc is c])) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reset = sum(len(c.reset) for c in conns)
    for c in conns:
        c.close()
    return sent[0], reset


def memory(env):
    port, _ = start_secure_learner(env)
    proc = env.procs[-1]
    stub = wait_serving(env, port)
    start = resident_mib(proc.pid)
    peak, done = watch_peak(proc.pid)
    payload = b"\x0a\x00" * (MB60 // 2)
    codes = []

    def send(n):
        ch = channel(env, port)
        call = ch.unary_unary(SUBMIT)
        for _ in range(n):
            codes.append(code_of(lambda: call(payload, timeout=120))[0])
    senders = [threading.Thread(target=send, args=(4,)) for _ in range(12)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    check(codes == [grpc.StatusCode.UNAUTHENTICATED] * 48,
          "48 anonymous Submits of 60 MB: UNAUTHENTICATED (%s)" % sorted(set(c.name for c in codes)))
    sent, reset = short_messages(port, True, 60, 20, 8)
    done.set()
    check(reset == 60, "60 raw HTTP/2 messages of 60 MB, one byte short: each stream reset (%d)" % reset)
    check(sent <= 60 * 256 * 1024, "the learner let %.1f MiB of them in (flow control)" % (sent / 2**20))
    print("figure: resident %.0f MiB at start, %.0f MiB at the peak" % (start, peak[0]))
    check(peak[0] < 400, "the learner stayed under 400 MiB resident (peak %.0f MiB)" % peak[0])
    reply = stub.Submit(batch(env, "after"), metadata=TOKEN, timeout=30)
    check(reply.accepted_groups == 2, "a token holder is served afterwards")
    env.stop_all()
    plaintext_tokens(env)


def plaintext_tokens(env):
    """Plaintext on loopback with tokens: the gate runs there too."""
    port = free_port()
    proc = env.run_learner(["--listen=127.0.0.1:%d" % port, "--metrics_address=",
                            "--auth_file=" + env.write("plain.json", open(os.path.join(
                                env.work, "principals.json")).read())], "plaintext")
    stub = wait_serving(env, port, tls=False)
    peak, done = watch_peak(proc.pid)
    sent, reset = short_messages(port, False, 20, 20, 4)
    done.set()
    check(reset == 20, "plaintext with tokens: 20 short messages reset on their headers (%d)" % reset)
    check(peak[0] < 400, "plaintext with tokens: under 400 MiB (peak %.0f MiB)" % peak[0])
    reply = stub.Submit(batch(env, "plain"), metadata=TOKEN, timeout=30)
    check(reply.accepted_groups == 2, "plaintext with tokens: a token holder is served")
    env.stop_all()


def outsider(port, source, count):
    conns = []
    for _ in range(count):
        try:
            c = raw_http2.Connection(port, True, source=source)
            c.pump(0.05)
            conns.append(c)
        except OSError:
            pass
    return conns


def still_open(conns):
    n = 0
    for c in conns:
        c.pump(0.01)
        n += not c.closed
    return n


def connections(env):
    port, metrics_port = start_secure_learner(env, ["--max_connections=64",
                                                    "--max_connections_per_peer=16",
                                                    "--connection_auth_grace=3s"])
    wait_serving(env, port)
    far = outsider(port, "127.0.0.2", 100)
    near = outsider(port, "127.0.0.1", 100)
    time.sleep(0.5)
    open_far = still_open(far)
    check(open_far <= 16, "127.0.0.2: at most 16 of its 100 connections open (%d)" % open_far)
    t0 = time.time()
    stub = env.pb2_grpc.LearnerStub(channel(env, port))
    status = stub.GetStatus(env.pb2.GetStatusRequest(), metadata=TOKEN, timeout=10)
    took = time.time() - t0
    print("figure: a token holder served %.2f s into the hold" % took)
    check(status.queue_capacity_groups > 0 and took < 5,
          "a token holder is served while the outsider holds connections (%.2f s)" % took)
    time.sleep(4)
    left = still_open(far) + still_open(near)
    check(left == 0, "connections without an authorized call closed after the 3 s grace (%d open)" % left)
    status = stub.GetStatus(env.pb2.GetStatusRequest(), metadata=TOKEN, timeout=10)
    check(status.queue_capacity_groups > 0, "the token holder's own connection stays open")
    text = scrape(metrics_port)
    closed = sample(text, "asympo_learner_connections_total", result="closed_unauthenticated")
    at_peer = sample(text, "asympo_learner_connections_total", result="refused_at_peer_limit")
    check(closed + at_peer >= 168, "/metrics: %d closed without an authorized call, %d refused at "
          "the limit per address" % (closed, at_peer))
    for c in far + near:
        c.close()
    env.stop_all()


def shares(env):
    from fair_shares import run
    run(env)


def main():
    run_scenario({"memory": memory, "connections": connections, "shares": shares})


if __name__ == "__main__":
    main()
