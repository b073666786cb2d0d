#!/usr/bin/env python3
"""The learner's security, with real processes and a client of its own
(Python grpcio, not the project's C++ client), certificates made by openssl:

  policy  nothing listens beyond loopback in plaintext, or without client
          authentication, unless --insecure; nor /metrics without
          --metrics_insecure; bad certificate files stop the start
  tls     a learner with TLS, mTLS and a principals file: good and bad
          tokens, roles, certificates (wrong CA, expired, unknown), all
          refused ones counted by cause, nothing of them queued; requests
          that do not parse are INVALID_ARGUMENT on every method, a
          SubmitStream too; openssl s_client gets TLS 1.2 and 1.3
          handshakes and none with 1.0 or 1.1
  loop    a rollout daemon trains the learner over mTLS with a token, and
          gets its weights back
  memory  a burst of large Submits that fail validation leaves no memory
          behind: the learner gives the freed heap back to the kernel

security_test.py SCENARIO PROTO_DIR LEARNER ROLLOUT MAKE_CERTS WORK"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner_client import check, free_port, generate_stubs, grpc  # noqa: E402


def wait_exit(proc, timeout=60):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


class Env:
    def __init__(self, proto_dir, learner, rollout, make_certs, work):
        self.learner, self.rollout, self.work = learner, rollout, work
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        self.pb2, self.pb2_grpc, self.rollout_pb2 = generate_stubs(proto_dir, work)
        self.certs = os.path.join(work, "certs")
        subprocess.run([make_certs, self.certs], check=True, stdout=subprocess.DEVNULL)
        self.procs = []

    def cert(self, name):
        return os.path.join(self.certs, name)

    def read(self, name):
        with open(self.cert(name), "rb") as f:
            return f.read()

    def write(self, name, text):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_learner(self, args, name):
        log = open(os.path.join(self.work, name + ".log"), "w")
        p = subprocess.Popen([self.learner, "--prompts_per_step=2", "--lr=1e-3"] + args,
                             stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            wait_exit(p, 30)


def refused_at_start(env, args, name, words):
    p = env.run_learner(args, name)
    code = wait_exit(p, 60)
    text = env.log(name)
    check(code == 2 and all(w in text for w in words),
          "%s: exits 2 naming %s (exit %s)" % (name, words, code))


def policy(env):
    port = free_port()
    refused_at_start(env, ["--listen=0.0.0.0:%d" % port, "--metrics_address="], "plaintext",
                     ["refusing to listen on 0.0.0.0:%d in plaintext" % port, "--insecure"])
    tls = ["--tls_cert=" + env.cert("server.pem"), "--tls_key=" + env.cert("server.key")]
    refused_at_start(env, ["--listen=0.0.0.0:%d" % port, "--metrics_address="] + tls, "tls_only",
                     ["without client authentication", "--auth_file"])
    refused_at_start(env, ["--listen=127.0.0.1:%d" % port, "--metrics_address=0.0.0.0:%d" %
                           free_port()], "metrics", ["refusing to serve /metrics", "--metrics_insecure"])
    refused_at_start(env, ["--listen=127.0.0.1:%d" % port, "--metrics_address=",
                           "--tls_cert=" + env.cert("server.pem"), "--tls_key=" + env.cert("other.key")],
                     "wrong_key", ["is not the key of certificate"])
    refused_at_start(env, ["--listen=127.0.0.1:%d" % port, "--metrics_address=",
                           "--tls_cert=" + env.cert("expired.pem"),
                           "--tls_key=" + env.cert("expired.key")], "expired", ["expired on"])
    p = env.run_learner(["--listen=0.0.0.0:%d" % port, "--metrics_address=", "--insecure"],
                        "insecure")
    stub = env.pb2_grpc.LearnerStub(grpc.insecure_channel("127.0.0.1:%d" % port))
    status = stub.GetStatus(env.pb2.GetStatusRequest(), wait_for_ready=True, timeout=60)
    check(status.queue_capacity_groups > 0, "--insecure: serves plaintext beyond loopback")
    check("anyone who reaches the port" in env.log("insecure"), "--insecure: warns in its log")
    env.stop_all()


def principals(env):
    entries = [
        {"name": "gen", "token_sha256": hashlib.sha256(b"gen-token").hexdigest(),
         "roles": ["submit", "status"]},
        {"name": "reader", "token_sha256": hashlib.sha256(b"reader-token").hexdigest(),
         "roles": ["read_weights"]},
        {"name": "rollouts", "certificate": "rollout-1",
         "roles": ["submit", "read_weights", "status"]},
    ]
    return env.write("principals.json", json.dumps({"principals": entries}))


def start_secure_learner(env, extra=()):
    port, metrics_port = free_port(), free_port()
    args = ["--listen=127.0.0.1:%d" % port, "--metrics_address=127.0.0.1:%d" % metrics_port,
            "--tls_cert=" + env.cert("server.pem"), "--tls_key=" + env.cert("server.key"),
            "--tls_client_ca=" + env.cert("ca.pem"), "--auth_file=" + principals(env)]
    env.run_learner(args + list(extra), "secure")
    return port, metrics_port


def channel(env, port, cert=None):
    creds = grpc.ssl_channel_credentials(
        root_certificates=env.read("ca.pem"),
        private_key=env.read(cert + ".key") if cert else None,
        certificate_chain=env.read(cert + ".pem") if cert else None)
    ch = grpc.secure_channel("127.0.0.1:%d" % port, creds)
    grpc.channel_ready_future(ch).result(timeout=60)
    return ch


def batch(env, tag, groups=2):
    r = env.rollout_pb2
    return r.RolloutBatch(groups=[r.PromptGroup(
        prompt_id="%s%d" % (tag, g), prompt_tokens=[1, 2],
        responses=[r.Response(tokens=[3, 4], reward=float(k)) for k in range(2)])
        for g in range(groups)])


def code_of(call):
    try:
        call()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


def sample(text, name, **labels):
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all('%s="%s"' % kv in line for kv in labels.items()):
            return float(line.rpartition(" ")[2])
    return 0.0


def credential_matrix(env, port):
    token = lambda t: (("authorization", "Bearer " + t),)  # noqa: E731
    plain = env.pb2_grpc.LearnerStub(channel(env, port))
    cases = [
        ("good token", plain, token("gen-token"), grpc.StatusCode.OK, ""),
        ("wrong token", plain, token("nope"), grpc.StatusCode.UNAUTHENTICATED, "not one"),
        ("no credentials", plain, (), grpc.StatusCode.UNAUTHENTICATED, "no credentials"),
        ("another role's token", plain, token("reader-token"), grpc.StatusCode.PERMISSION_DENIED,
         "lacks the role submit"),
        ("client certificate", env.pb2_grpc.LearnerStub(channel(env, port, "client")), (),
         grpc.StatusCode.OK, ""),
        ("certificate of another CA", env.pb2_grpc.LearnerStub(channel(env, port, "rogue")), (),
         grpc.StatusCode.UNAUTHENTICATED, "not trusted"),
        ("expired certificate", env.pb2_grpc.LearnerStub(channel(env, port, "expired")), (),
         grpc.StatusCode.UNAUTHENTICATED, "expired on"),
        ("certificate of no principal", env.pb2_grpc.LearnerStub(channel(env, port, "client2")),
         (), grpc.StatusCode.UNAUTHENTICATED, "names no principal"),
    ]
    for i, (what, stub, md, want, words) in enumerate(cases):
        got, details = code_of(lambda: stub.Submit(batch(env, "m%d-" % i), metadata=md, timeout=30))
        check(got == want and words in details, "%s: %s (%s)" % (what, want.name, details))
    return plain


def garbage(env, port, plain):
    md = (("authorization", "Bearer gen-token"),)
    rollouts = channel(env, port, "client")
    for method, ch, meta in [("/asympo.v1.Learner/Submit", channel(env, port), md),
                             ("/asympo.v1.Learner/GetStatus", channel(env, port), md),
                             ("/asympo.v1.WeightBroadcast/Register", rollouts, ()),
                             ("/asympo.v1.WeightBroadcast/ReportVersion", rollouts, ())]:
        call = ch.unary_unary(method)
        got, details = code_of(lambda: call(b"\x0a\xff\xff\xff\xff\x0f", metadata=meta, timeout=30))
        check(got == grpc.StatusCode.INVALID_ARGUMENT and "is not a valid asympo.v1." in details,
              "%s with bytes that do not parse: INVALID_ARGUMENT (%s)" % (method, details))
    sub = rollouts.unary_stream("/asympo.v1.WeightBroadcast/Subscribe")
    got, details = code_of(lambda: list(sub(b"\x0a\x02\xc3\x28", timeout=30)))
    check(got == grpc.StatusCode.INVALID_ARGUMENT and "not valid UTF-8" in details,
          "Subscribe with a session id that is not UTF-8: INVALID_ARGUMENT (%s)" % details)
    stream = channel(env, port).stream_unary("/asympo.v1.Learner/SubmitStream")
    good = batch(env, "s").SerializeToString()
    got, details = code_of(lambda: stream(iter([good, b"\x0a\x05\x0a\x01\xff"]), metadata=md,
                                          timeout=30))
    check(got == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("batch 1: "),
          "SubmitStream with a batch that does not parse: INVALID_ARGUMENT after batch 0 (%s)"
          % details)
    huge = env.rollout_pb2.RolloutBatch()
    huge.groups.extend([env.rollout_pb2.PromptGroup()] * 200000)  # 400 KB, 200,000 groups
    got, details = code_of(lambda: plain.Submit(huge, metadata=md, timeout=30))
    check(got == grpc.StatusCode.INVALID_ARGUMENT and "200000 groups" in details,
          "200,000 empty groups: refused on the wire (%s)" % details)


def tls_versions(env, port):
    """A client apart from gRPC's: openssl s_client completes TLS 1.2 and
    1.3 handshakes, verified against the CA, and gets none with 1.0 or 1.1."""
    if shutil.which("openssl") is None:
        print("note: no openssl binary; TLS versions not checked")
        return
    for version, wanted in [("-tls1", False), ("-tls1_1", False), ("-tls1_2", True),
                            ("-tls1_3", True)]:
        # SECLEVEL=0: this client offers the old versions, whatever the
        # system's OpenSSL policy; the learner must be the one to refuse.
        weak = [] if wanted else ["-cipher", "DEFAULT@SECLEVEL=0"]
        r = subprocess.run(["openssl", "s_client", version, "-connect", "127.0.0.1:%d" % port,
                            "-CAfile", env.cert("ca.pem"), "-alpn", "h2", "-verify_return_error"]
                           + weak,
                           input=b"", capture_output=True, timeout=30)
        out = r.stdout.decode(errors="replace")
        check("CONNECTED(" in out, "openssl s_client %s reached the port" % version)
        done = r.returncode == 0 and "Verify return code: 0 (ok)" in out and "Cipher is (NONE)" not in out
        check(done == wanted, "openssl s_client %s: %s" % (
            version, "handshake done and verified" if done else "no handshake"))


def tls(env):
    port, metrics_port = start_secure_learner(env)
    plain = credential_matrix(env, port)
    tls_versions(env, port)
    garbage(env, port, plain)
    status = plain.GetStatus(env.pb2.GetStatusRequest(),
                             metadata=(("authorization", "Bearer gen-token"),), timeout=30)
    # Accepted: the good token's and the certificate's batches, and the
    # stream's first batch (2 groups each); nothing of the refused ones.
    check(status.accepted_groups == 6, "only the accepted batches' groups were queued (%d)" %
          status.accepted_groups)
    text = scrape(metrics_port)
    for cause, n in [("bad_token", 1), ("missing_credentials", 1), ("role", 1),
                     ("bad_certificate", 2), ("unknown_certificate", 1)]:
        got = sample(text, "asympo_learner_refusals_total", cause=cause)
        check(got == n, "refusals counted by cause: %s = %d (%s)" % (cause, n, got))
    check(sample(text, "asympo_learner_source_batches_total", source="gen", result="accepted") == 2
          and sample(text, "asympo_learner_source_batches_total", source="rollouts",
                     result="accepted") == 1,
          "batches counted by source")
    env.stop_all()


def loop(env):
    port, metrics_port = start_secure_learner(env, ["--max_steps=0"])
    rollout_log = open(os.path.join(env.work, "rollout.log"), "w")
    rollout_metrics = free_port()
    rollout = subprocess.Popen(
        [env.rollout, "--learner=127.0.0.1:%d" % port, "--id=rollout-1",
         "--metrics_address=127.0.0.1:%d" % rollout_metrics,
         "--tls_ca=" + env.cert("ca.pem"), "--tls_cert=" + env.cert("client.pem"),
         "--tls_key=" + env.cert("client.key"), "--group_size=4", "--prompts_per_generation=2"],
        stdout=rollout_log, stderr=subprocess.STDOUT)
    env.procs.append(rollout)
    stub = env.pb2_grpc.LearnerStub(channel(env, port))
    md = (("authorization", "Bearer gen-token"),)
    deadline = time.time() + 120
    status = None
    while time.time() < deadline:
        status = stub.GetStatus(env.pb2.GetStatusRequest(), metadata=md, timeout=30)
        if status.steps >= 5:
            break
        time.sleep(0.5)
    check(status is not None and status.steps >= 5,
          "a rollout over mTLS trains the learner (%s steps)" % (status and status.steps))
    # The rollout's weights come back over the same TLS port.
    deadline = time.time() + 60
    version = 0.0
    while time.time() < deadline and version < 1:
        version = sample(scrape(rollout_metrics), "asympo_rollout_weight_version")
        time.sleep(0.5)
    check(version >= 1, "the rollout samples with weights fetched over TLS (version %s)" % version)
    text = scrape(metrics_port)
    check(sample(text, "asympo_learner_source_batches_total", source="rollouts",
                 result="accepted") > 0, "its batches are counted under its principal")
    env.stop_all()


def resident_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024.0


def memory(env):
    """36 Submits of 48 MB, twelve at a time, each of 24 million empty groups
    (refused on the wire): gRPC receives each into fresh buffers, and glibc
    kept them all, 0.7 GiB resident for good. With --free_heap_limit_mib=64
    the learner must come back to within 64 MiB (and some slack) of where it
    started."""
    for bad in ["-1", "1048577"]:
        refused_at_start(env, ["--free_heap_limit_mib=" + bad, "--metrics_address="],
                         "heap_limit" + bad, ["--free_heap_limit_mib=" + bad, "expected 0 to"])
    port, metrics_port = free_port(), free_port()
    # A grace far shorter than the burst takes to arrive: connections still
    # receiving their first request are not idle (docs/security.md).
    proc = env.run_learner(["--listen=127.0.0.1:%d" % port,
                            "--metrics_address=127.0.0.1:%d" % metrics_port,
                            "--free_heap_limit_mib=64", "--connection_auth_grace=2s"], "memory")
    stub = env.pb2_grpc.LearnerStub(grpc.insecure_channel("127.0.0.1:%d" % port))
    stub.GetStatus(env.pb2.GetStatusRequest(), wait_for_ready=True, timeout=60)
    start = resident_mib(proc.pid)
    peak, done = watch_peak(proc.pid)
    payload = b"\x0a\x00" * (24 << 20)
    codes = []

    def send(n):
        ch = grpc.insecure_channel("127.0.0.1:%d" % port, options=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1)])
        call = ch.unary_unary("/asympo.v1.Learner/Submit")
        for _ in range(n):
            codes.append(code_of(lambda: call(payload, timeout=120))[0])
    senders = [threading.Thread(target=send, args=(3,)) for _ in range(12)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    done.set()
    check(codes == [grpc.StatusCode.INVALID_ARGUMENT] * 36,
          "36 Submits of 48 MB: each refused on the wire (%s; connections closed unauthenticated: %s)"
          % (sorted(set(c.name for c in codes)),
             sample(scrape(metrics_port), "asympo_learner_connections_total", result="closed_unauthenticated")))
    deadline = time.time() + 20
    while resident_mib(proc.pid) > start + 64 + 96 and time.time() < deadline:
        time.sleep(0.2)
    after = resident_mib(proc.pid)
    check(after <= start + 64 + 96, "resident memory %.0f MiB at start, %.0f MiB at the peak, %.0f "
          "MiB after: back within the 64 MiB kept for reuse" % (start, peak[0], after))
    released = sample(scrape(metrics_port), "asympo_learner_heap_released_bytes_total")
    check(released > 0, "/metrics: %.0f MiB given back to the kernel" % (released / 2**20))
    env.stop_all()


def watch_peak(pid):
    """Samples `pid`'s resident MiB every 50 ms: returns [peak] (updated in
    place) and the event that stops the sampling."""
    peak, done = [resident_mib(pid)], threading.Event()

    def watch():
        while not done.wait(0.05):
            peak[0] = max(peak[0], resident_mib(pid))
    threading.Thread(target=watch, daemon=True).start()
    return peak, done


def run_scenario(scenarios):
    """Runs the scenario sys.argv[1] names, of `scenarios` (name: function
    of an Env), with the rest of the command line as the module says."""
    scenario, proto_dir, learner, rollout, make_certs, work = sys.argv[1:7]
    if shutil.which("openssl") is None:
        print("SKIP: openssl missing")
        sys.exit(77)
    check(scenario in scenarios, "scenario %s is one of %s" % (scenario, sorted(scenarios)))
    env = Env(proto_dir, learner, rollout, make_certs, work)
    try:
        scenarios[scenario](env)
    finally:
        env.stop_all()


def main():
    run_scenario({"policy": policy, "tls": tls, "loop": loop, "memory": memory})


if __name__ == "__main__":
    main()
