"""Multi-turn episodes with real processes on loopback: asympo-learner and
an asympo-rollout daemon on the "add_tool" task. Scenarios (one per run):

  builtin   the daemon's built-in calculator: episodes end done, the
            calculator's answers are inserted, the groups train the learner
  python    the same task served by the Python example through the
            asympo.v1.Environment service; the service killed: episodes fail
            as "unavailable", their groups are dropped, the daemon goes on;
            started again: episodes run again

    python3 episodes_test.py SCENARIO LEARNER ROLLOUT PKG_DIR WORK_DIR
Exit 0 on success, 1 on a failed check, 77 without grpc for Python."""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys

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


def started_environment(pkg, port, log):
    env = dict(os.environ, PYTHONPATH=pkg)
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "..", "proto", "python", "examples",
                                                       "calculator_environment.py"),
                          "--listen=127.0.0.1:%d" % port], stdout=log, stderr=subprocess.STDOUT, env=env)
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


def scenario_python(c, pkg):
    port = free_port()
    log = open(os.path.join(c.work, "environment.log"), "a")
    env = started_environment(pkg, port, log)
    c.start_learner()
    c.start_rollout(0, ROLLOUT_FLAGS + ["--environment=127.0.0.1:%d" % port, "--environment_timeout=5s"])
    trains(c, "Python environment")
    env.send_signal(signal.SIGKILL)
    env.wait()
    wait_for("episodes fail as unavailable once the environment is gone",
             lambda: metric(c.rollout(0), "asympo_rollout_episodes_failed_total", reason="unavailable") > 0,
             timeout=60)
    wait_for("their groups are dropped",
             lambda: metric(c.rollout(0), "asympo_rollout_groups_dropped_total", reason="environment") > 0,
             timeout=30)
    before = metric(c.rollout(0), "asympo_rollout_episodes_total")
    env = started_environment(pkg, port, log)
    wait_for("the daemon runs episodes again once the environment is back",
             lambda: metric(c.rollout(0), "asympo_rollout_episodes_total") >= before + 8, timeout=90)
    check(c.stop("rollout-0", signal.SIGINT) == 0, "the daemon exits 0 on SIGINT")
    env.send_signal(signal.SIGTERM)
    env.wait(10)


def main():
    scenario, learner_bin, rollout_bin, pkg, work = sys.argv[1:6]
    if importlib.util.find_spec("grpc") is None:
        print("SKIP: grpc for Python is missing")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    c = Cluster(learner_bin, rollout_bin, work)
    run_scenario(c, scenario, lambda: scenario_builtin(c) if scenario == "builtin" else scenario_python(c, pkg))

if __name__ == "__main__":
    main()
