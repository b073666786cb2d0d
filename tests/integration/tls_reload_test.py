#!/usr/bin/env python3
"""A TLS learner whose certificate, key or client CA file is rotated wrong
while it runs, one way per scenario:

  empty_cert      the certificate replaced by an empty file
  empty_key       the key replaced by an empty file
  truncated_cert  the certificate cut to half its size in place
  garbage_cert    the certificate replaced by bytes that are no PEM
  wrong_key       the key replaced by a key of no certificate here
  expired_cert    certificate and key replaced by an expired pair
  bad_ca          the client CA file (--tls_client_ca) cut short in place

gRPC 1.51 aborted on the first three about 8 s later and took the others,
breaking every new handshake. Each scenario checks that the learner stays
up, that a new TLS handshake (Python's ssl, a client apart from gRPC's)
still completes and sees the certificate in force, that calls still
succeed, that the refusal is counted (asympo_tls_reload_failures_total,
asympo_tls_reload_refused) and logged naming the file, and that good
files are taken once they return (a renewal under another CA); then that
the learner stops cleanly.

tls_reload_test.py SCENARIO PROTO_DIR LEARNER ROLLOUT MAKE_CERTS WORK"""
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner_client import check, free_port, grpc  # noqa: E402
from security_test import batch, code_of, principals, run_scenario, sample, scrape, wait_exit  # noqa: E402

TOKEN = (("authorization", "Bearer gen-token"),)


def served_certificate(port, ca):
    """The DER certificate a new handshake verified against `ca` gets, or
    None when the handshake fails."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname="localhost") as t:
                return t.getpeercert(binary_form=True)
    except (ssl.SSLError, OSError):
        return None


def der(path):
    with open(path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def not_after(path):
    out = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-enddate"], check=True,
                         capture_output=True, text=True).stdout
    return ssl.cert_time_to_seconds(out.strip().split("=", 1)[1])


def stub(env, port, ca, cert=None):
    """A stub on a channel of its own (a new handshake)."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=env.read(ca),
        private_key=env.read(cert + ".key") if cert else None,
        certificate_chain=env.read(cert + ".pem") if cert else None)
    ch = grpc.secure_channel("127.0.0.1:%d" % port, creds,
                             options=[("grpc.use_local_subchannel_pool", 1)])
    return env.pb2_grpc.LearnerStub(ch)


def replace(path, data):
    """What an operator's tool does right: a new file renamed over."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def wait_until(what, cond, timeout, poke=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if poke:
            poke()
        if cond():
            return True
        time.sleep(0.5)
    check(cond(), what)
    return True


# scenario: (what it breaks, the file blamed for it)
SCENARIOS = {
    "empty_cert": ("the certificate replaced by an empty file", "cert"),
    "empty_key": ("the key replaced by an empty file", "key"),
    "truncated_cert": ("the certificate cut short in place", "cert"),
    "garbage_cert": ("the certificate replaced by garbage", "cert"),
    "wrong_key": ("the key replaced by another key", "key"),
    "expired_cert": ("an expired certificate and its key", "cert"),
    "bad_ca": ("the client CA file cut short in place", "ca"),
}


def break_files(env, scenario, live):
    if scenario == "empty_cert":
        replace(live["cert"], b"")
    elif scenario == "empty_key":
        replace(live["key"], b"")
    elif scenario == "truncated_cert":
        os.truncate(live["cert"], os.path.getsize(live["cert"]) // 2)
    elif scenario == "garbage_cert":
        replace(live["cert"], os.urandom(700))
    elif scenario == "wrong_key":
        replace(live["key"], env.read("other.key"))
    elif scenario == "expired_cert":
        replace(live["key"], env.read("expired.key"))
        replace(live["cert"], env.read("expired.pem"))
    elif scenario == "bad_ca":
        os.truncate(live["ca"], os.path.getsize(live["ca"]) - 60)


def start(env):
    live_dir = os.path.join(env.work, "live")
    os.makedirs(live_dir)
    live = {"cert": os.path.join(live_dir, "cert.pem"), "key": os.path.join(live_dir, "key.pem"),
            "ca": os.path.join(live_dir, "client_ca.pem")}
    for name, source in [("cert", "server.pem"), ("key", "server.key"), ("ca", "ca.pem")]:
        shutil.copy(env.cert(source), live[name])
    port, metrics_port = free_port(), free_port()
    proc = env.run_learner(["--listen=127.0.0.1:%d" % port,
                            "--metrics_address=127.0.0.1:%d" % metrics_port,
                            "--tls_cert=" + live["cert"], "--tls_key=" + live["key"],
                            "--tls_client_ca=" + live["ca"], "--auth_file=" + principals(env)],
                           "reload")
    status = stub(env, port, "ca.pem").GetStatus(env.pb2.GetStatusRequest(), metadata=TOKEN,
                                                 wait_for_ready=True, timeout=60)
    check(status.queue_capacity_groups > 0, "a TLS learner with mTLS and tokens is up")
    return proc, port, metrics_port, live


def still_serving(env, proc, port, scenario, metrics_port):
    check(proc.poll() is None, "%s: the learner stays up" % scenario)
    check(served_certificate(port, env.cert("ca.pem")) == der(env.cert("server.pem")),
          "%s: a new TLS handshake completes and sees the certificate in force" % scenario)
    got, details = code_of(lambda: stub(env, port, "ca.pem").Submit(
        batch(env, "after-"), metadata=TOKEN, timeout=30))
    check(got == grpc.StatusCode.OK, "%s: a new channel submits (%s)" % (scenario, details))
    # A client certificate not verified before: the CA in force verifies it
    # (it names no principal, which is checked after the CA trusts it).
    got, details = code_of(lambda: stub(env, port, "ca.pem", "client2").GetStatus(
        env.pb2.GetStatusRequest(), timeout=30))
    check(got == grpc.StatusCode.UNAUTHENTICATED and "names no principal" in details,
          "%s: a client certificate is verified by the CA in force (%s)" % (scenario, details))


def renew(env, scenario, live, port):
    """Good files return: a renewal under another CA (server2, rogue_ca)."""
    if scenario == "bad_ca":
        replace(live["ca"], env.read("rogue_ca.pem"))
        # The rogue CA's client certificate (CN=rollout-1) is now trusted.
        wait_until("bad_ca: the renewed client CA is taken",
                   lambda: code_of(lambda: stub(env, port, "ca.pem", "rogue").Submit(
                       batch(env, "renewed-"), timeout=30))[0] == grpc.StatusCode.OK, 60)
        return
    replace(live["key"], env.read("server2.key"))
    replace(live["cert"], env.read("server2.pem"))
    wait_until("%s: the renewed certificate is served" % scenario,
               lambda: served_certificate(port, env.cert("rogue_ca.pem")) ==
               der(env.cert("server2.pem")), 60)


def reload_scenario(env, scenario):
    what, blamed = SCENARIOS[scenario]
    proc, port, metrics_port, live = start(env)
    path = live[blamed]
    break_files(env, scenario, live)
    print("broken:", what)
    # The learner reads its files every 10 s; the client CA is looked at
    # when a client certificate is verified, so calls with one go on.
    poke = (lambda: code_of(lambda: stub(env, port, "ca.pem", "client").GetStatus(
        env.pb2.GetStatusRequest(), timeout=10))) if blamed == "ca" else None
    wait_until("%s: the refusal is counted for %s" % (scenario, path),
               lambda: sample(scrape(metrics_port), "asympo_tls_reload_failures_total",
                              file=path) >= 1, 60, poke)
    time.sleep(3)  # gRPC reads its copies every second: give it a few
    still_serving(env, proc, port, scenario, metrics_port)
    text = scrape(metrics_port)
    check(sample(text, "asympo_tls_reload_refused", file=path) == 1,
          "%s: asympo_tls_reload_refused{file=%s} is 1" % (scenario, path))
    check("refusing the renewed TLS file " + path in env.log("reload"),
          "%s: the log names the file refused" % scenario)
    renew(env, scenario, live, port)
    text = scrape(metrics_port)
    check(sample(text, "asympo_tls_reload_refused", file=path) == 0 and
          sample(text, "asympo_tls_reloads_total", file=path if blamed == "ca" else live["cert"]) >= 1,
          "%s: the renewal is counted and the refusal cleared" % scenario)
    if blamed != "ca":
        expiry = sample(text, "asympo_tls_certificate_expiry_timestamp_seconds", file=live["cert"])
        check(expiry == not_after(env.cert("server2.pem")),
              "%s: the expiry gauge is the renewed certificate's (%s)" % (scenario, expiry))
    proc.send_signal(signal.SIGTERM)
    code = wait_exit(proc, 60)
    check(code == 0, "%s: the learner stops cleanly (exit %s)" % (scenario, code))


def main():
    run_scenario({name: (lambda env, name=name: reload_scenario(env, name)) for name in SCENARIOS})


if __name__ == "__main__":
    main()
