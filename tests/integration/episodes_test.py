"""Multi-turn episodes with real processes on loopback: asympo-learner and
an asympo-rollout daemon on the "add_tool" task. Scenarios (one per run):

  builtin   the daemon's built-in calculator: episodes end done, the
            calculator's answers are inserted, the groups train the learner
  python    the same task served by the Python example through the
            asympo.v1.Environment service, with a bearer token (serve
            refuses non-loopback addresses without TLS, and calls without
            the token); the service killed: episodes fail
            as "unavailable", their groups are dropped, the daemon goes on;
            started again: episodes run again; started with another
            token: it refuses the daemon, which stops, naming
            --environment_token_file
  raw       a server written from docs/protocol.md with grpc alone (not
            asympo_rl.Environment): it checks the bearer token, appends
            tokens after the first turn, ends on the second or a final
            turn, and records every call; the daemon's calls follow the
            page's rules (one episode's calls never overlap, a Step only
            after its Reset, every episode closed once)

    python3 episodes_test.py SCENARIO LEARNER ROLLOUT PKG_DIR WORK_DIR
Exit 0 on success, 1 on a failed check, 77 without grpc for Python."""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rollout_loop_test import Cluster, check, free_port, run_scenario, wait_for  # noqa: E402

ROLLOUT_FLAGS = ["--task=add_tool", "--max_running_sequences=8", "--max_turns=6"]


def metric(m, name, **labels):
    """A sample of `m` (local_run.scrape's dict) by name and labels; 0 when absent."""
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for key, value in m.items():
        if key == name and not labels:
            return value
        if key.startswith(name + "{") and want in key:
            return value
    return 0


def started_environment(c, pkg, port, log, token_file):
    """The Python example on `port`, among c's processes (stopped with them)."""
    env = dict(os.environ, PYTHONPATH=pkg)
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "..", "proto", "python", "examples",
                                                       "calculator_environment.py"),
                          "--listen=127.0.0.1:%d" % port, "--token_file=" + token_file],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    c.procs["environment"] = p
    wait_for("the Python environment listens", lambda: "listening on" in open(log.name).read(), timeout=60)
    return p


def trains(c, what):
    wait_for("%s: the learner trains 3 steps on episodes" % what, lambda: c.version() >= 3, timeout=150)
    m = c.rollout(0)
    check(metric(m, "asympo_rollout_episodes_total") >= 8, "%s: %d episodes ended done" %
          (what, metric(m, "asympo_rollout_episodes_total")))
    check(metric(m, "asympo_rollout_inserted_tokens_total") > 0,
          "%s: the calculator's answers were inserted (%d tokens)" %
          (what, metric(m, "asympo_rollout_inserted_tokens_total")))
    check(metric(m, "asympo_rollout_groups_sent_total") > 0, "%s: the learner accepted groups" % what)
    return m


def scenario_builtin(c):
    c.start_learner()
    c.start_rollout(0, ROLLOUT_FLAGS)
    m = trains(c, "built-in calculator")
    failed = sum(v for k, v in m.items() if k.startswith("asympo_rollout_episodes_failed_total"))
    check(failed == 0, "no episode failed")
    check(c.stop("rollout-0", signal.SIGINT) == 0, "the daemon exits 0 on SIGINT")
    check(c.stop("learner", signal.SIGINT) == 0, "the learner exits 0 on SIGINT")
    # asympo-eval runs add_tool's held-out prompts as episodes too.
    out = os.path.join(c.work, "eval.json")
    r = subprocess.run([os.path.join(os.path.dirname(c.rollout_bin), "asympo-eval"),
                        "--checkpoint=" + os.path.join(c.work, "ckpt"), "--task=add_tool", "--k=2",
                        "--max_prompts=20", "--output=" + out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    check(r.returncode == 0, "asympo-eval --task=add_tool exits 0 (%s)" % r.stdout[-300:])
    report = json.load(open(out))
    check(report["prompts"] == 20 and 0 <= report["greedy_accuracy"] <= 1,
          "asympo-eval evaluated 20 held-out add_tool prompts (%s)" % r.stdout.strip().splitlines()[-1])


def serve_checks(pkg):
    """asympo_rl.Environment.serve listens beyond loopback only with TLS,
    and with a token refuses a call without it."""
    sys.path.insert(0, pkg)
    import grpc
    import asympo_rl
    from asympo_rl._stubs import environment_pb2, environment_pb2_grpc
    try:
        asympo_rl.Environment().serve("0.0.0.0:0")
        check(False, "serve refuses to listen beyond loopback without TLS")
    except asympo_rl.AsympoError as e:
        check("needs tls" in str(e), "serve refuses to listen beyond loopback without TLS (%s)" % e)
    server = asympo_rl.Environment().serve("127.0.0.1:0", token="s3cret")
    stub = environment_pb2_grpc.EnvironmentStub(grpc.insecure_channel("127.0.0.1:%d" % server.port))
    try:
        stub.Reset(environment_pb2.ResetRequest(prompt_id="p"), timeout=10)
        code = None
    except grpc.RpcError as e:
        code = e.code()
    check(code == grpc.StatusCode.UNAUTHENTICATED, "a call without the token is refused (%s)" % code)
    server.stop(0)
    leak_checks(grpc, asympo_rl, environment_pb2, environment_pb2_grpc)


def leak_checks(grpc, asympo_rl, environment_pb2, environment_pb2_grpc):
    """No episode stays open for good: one whose Reset was cancelled (its
    deadline passed) is closed at once, one no call touched for
    idle_timeout is closed by the next Reset."""
    class Recorder(asympo_rl.Environment):
        def __init__(self):
            self.closed, self.reset_seconds = [], 0.0

        def reset(self, prompt_tokens, prompt_id, reference, index, seed):
            time.sleep(self.reset_seconds)
            return prompt_id

        def close(self, state):
            self.closed.append(state)

    try:
        Recorder().serve("127.0.0.1:0", idle_timeout=0)
        check(False, "serve refuses idle_timeout=0")
    except asympo_rl.AsympoError as e:
        check("idle_timeout" in str(e), "serve refuses idle_timeout=0 (%s)" % e)
    env = Recorder()
    server = env.serve("127.0.0.1:0", idle_timeout=0.4)
    stub = environment_pb2_grpc.EnvironmentStub(grpc.insecure_channel("127.0.0.1:%d" % server.port))
    env.reset_seconds = 0.5
    try:
        stub.Reset(environment_pb2.ResetRequest(prompt_id="cancelled"), timeout=0.1)
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, "the slow Reset passes its deadline")
    wait_for("the episode of a Reset past its deadline is closed", lambda: "cancelled" in env.closed, 10)
    env.reset_seconds = 0.0
    idle = stub.Reset(environment_pb2.ResetRequest(prompt_id="idle"), timeout=10).episode_id
    time.sleep(0.6)
    stub.Reset(environment_pb2.ResetRequest(prompt_id="fresh"), timeout=10)
    check(env.closed == ["cancelled", "idle"], "an episode idle past idle_timeout is closed (%s)" % env.closed)
    try:
        stub.Step(environment_pb2.StepRequest(episode_id=idle), timeout=10)
        code = None
    except grpc.RpcError as e:
        code = e.code()
    check(code == grpc.StatusCode.NOT_FOUND, "a Step of the expired episode is NOT_FOUND (%s)" % code)
    server.stop(0)


def scenario_python(c, pkg):
    serve_checks(pkg)
    port = free_port()
    log = open(os.path.join(c.work, "environment.log"), "a")
    token = os.path.join(c.work, "environment.token")
    with open(token, "w") as f:
        f.write("episode-token-%d\n" % port)
    env = started_environment(c, pkg, port, log, token)
    c.start_learner()
    c.start_rollout(0, ROLLOUT_FLAGS + ["--environment=127.0.0.1:%d" % port, "--environment_timeout=5s",
                                        "--environment_token_file=" + token])
    trains(c, "Python environment")
    c.procs.pop("environment")
    env.send_signal(signal.SIGKILL)
    env.wait()
    wait_for("episodes fail as unavailable once the environment is gone",
             lambda: metric(c.rollout(0), "asympo_rollout_episodes_failed_total", reason="unavailable") > 0,
             timeout=60)
    wait_for("their groups are dropped",
             lambda: metric(c.rollout(0), "asympo_rollout_groups_dropped_total", reason="environment") > 0,
             timeout=30)
    before = metric(c.rollout(0), "asympo_rollout_episodes_total")
    env = started_environment(c, pkg, port, log, token)
    wait_for("the daemon runs episodes again once the environment is back",
             lambda: metric(c.rollout(0), "asympo_rollout_episodes_total") >= before + 8, timeout=90)
    # The environment comes back with another token: it refuses the daemon,
    # which stops with the flag to check rather than drop every group.
    c.stop("environment")
    with open(token + ".new", "w") as f:
        f.write("rotated-%d\n" % port)
    started_environment(c, pkg, port, log, token + ".new")
    daemon = c.procs["rollout-0"]
    wait_for("the daemon stops once the environment refuses its token", lambda: daemon.poll() is not None,
             timeout=90)
    c.procs.pop("rollout-0")
    out = open(os.path.join(c.work, "rollout-0.log")).read()
    check(daemon.returncode != 0 and "refused this daemon" in out and "--environment_token_file" in out,
          "it exits %d naming --environment_token_file" % daemon.returncode)
    c.stop("environment")


class RawEnvironment:
    """asympo.v1.Environment with grpc alone, as docs/protocol.md describes
    it; `violations` lists every call that breaks the page's rules."""

    def __init__(self, token):
        self.token, self.lock = token, threading.Lock()
        self.open, self.busy, self.closed, self.violations = {}, set(), set(), []
        self.done = 0
        self.reset_delay, self.resets_out = 0.0, 0  # seconds each Reset waits; Resets unanswered

    def _enter(self, context, episode_id, call):
        if dict(context.invocation_metadata()).get("authorization") != "Bearer " + self.token:
            import grpc
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a missing or wrong bearer token")
        with self.lock:
            if episode_id in self.busy:
                self.violations.append("%s of %s while another call of it was under way" % (call, episode_id))
            self.busy.add(episode_id)

    def _leave(self, episode_id):
        with self.lock:
            self.busy.discard(episode_id)

    def Reset(self, request, context):
        from asympo_rl._stubs import environment_pb2
        with self.lock:
            episode_id = "ep-%d" % len(self.open)
            self.open[episode_id] = 0
            self.resets_out += 1
            delay = self.reset_delay
        self._enter(context, episode_id, "Reset")
        time.sleep(delay)
        self._leave(episode_id)
        with self.lock:
            self.resets_out -= 1
        return environment_pb2.ResetResponse(episode_id=episode_id)

    def Step(self, request, context):
        from asympo_rl._stubs import environment_pb2
        self._enter(context, request.episode_id, "Step")
        try:
            with self.lock:
                if request.episode_id not in self.open or request.episode_id in self.closed:
                    self.violations.append("Step of %s, not open" % request.episode_id)
                    self.open[request.episode_id] = 0
                if request.turn != self.open[request.episode_id]:
                    self.violations.append("Step of %s: turn %d, expected %d" % (
                        request.episode_id, request.turn, self.open[request.episode_id]))
                self.open[request.episode_id] += 1
            if request.final or request.turn >= 1:
                with self.lock:
                    self.done += 1
                return environment_pb2.StepResponse(done=True, reward=float(len(request.turn_tokens) % 2),
                                                    correct=len(request.turn_tokens) % 2 == 1)
            return environment_pb2.StepResponse(append_tokens=[5, 6][:max(request.tokens_left - 1, 0)])
        finally:
            self._leave(request.episode_id)

    def Close(self, request, context):
        from asympo_rl._stubs import environment_pb2
        with self.lock:
            if request.episode_id in self.closed:
                self.violations.append("Close of %s twice" % request.episode_id)
            self.closed.add(request.episode_id)
        return environment_pb2.CloseResponse()


def scenario_raw(c, pkg):
    sys.path.insert(0, pkg)
    import grpc
    from concurrent import futures
    from asympo_rl._stubs import environment_pb2_grpc
    token = os.path.join(c.work, "raw.token")
    with open(token, "w") as f:
        f.write("raw-token\n")
    env = RawEnvironment("raw-token")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    environment_pb2_grpc.add_EnvironmentServicer_to_server(env, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        c.start_learner()
        c.start_rollout(0, ROLLOUT_FLAGS + ["--environment=127.0.0.1:%d" % port, "--environment_token_file=" + token])
        wait_for("the learner trains 3 steps on the raw server's episodes", lambda: c.version() >= 3, timeout=150)
        m = c.rollout(0)
        check(metric(m, "asympo_rollout_episodes_total") >= 8 and env.done >= 8,
              "%d episodes ended done" % metric(m, "asympo_rollout_episodes_total"))
        check(metric(m, "asympo_rollout_inserted_tokens_total") > 0, "the raw server's tokens were inserted")
        # The daemon stops while Resets are out: it still closes the
        # episodes they open once they answer.
        with env.lock:
            env.reset_delay = 0.4
        wait_for("a Reset is out", lambda: env.resets_out > 0, timeout=60)
        check(c.stop("rollout-0", signal.SIGINT) == 0, "the daemon exits 0 on SIGINT with Resets out")
        with env.lock:
            unclosed = sorted(set(env.open) - env.closed)
        check(not unclosed, "every episode the daemon started was closed (%s left)" % unclosed[:5])
        check(not env.violations, "the daemon's calls follow docs/protocol.md's rules (%s)" % env.violations[:5])
    finally:
        server.stop(0)


def main():
    scenario, learner_bin, rollout_bin, pkg, work = sys.argv[1:6]
    if importlib.util.find_spec("grpc") is None:
        print("SKIP: grpc for Python is missing")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    c = Cluster(learner_bin, rollout_bin, work)
    bodies = {"builtin": lambda: scenario_builtin(c), "python": lambda: scenario_python(c, pkg),
              "raw": lambda: scenario_raw(c, pkg)}
    run_scenario(c, scenario, bodies[scenario])

if __name__ == "__main__":
    main()
