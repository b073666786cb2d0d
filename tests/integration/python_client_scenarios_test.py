"""The Python client package (asympo_rl.LearnerClient, installed by the ctest
fixture PythonPackage.install) against real asympo-learner processes: the
retry deadline, local validation, fairness under backpressure, sessions and
recovery after a learner restart.

deadline:   an address nothing listens on, retry_deadline=2 and timeout=60:
            status(), submit() (with and without validation) and
            submit_stream() give up within 3.5 s with LearnerUnavailableError
            naming the target, the attempts and the seconds waited.

    python3 python_client_scenarios_test.py SCENARIO PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc is missing."""
import os
import signal
import subprocess
import sys
import time

from learner_client import check, free_port

SCENARIO, PKG, LEARNER, WORK = sys.argv[1:5]
sys.path.insert(0, PKG)
import asympo_rl  # noqa: E402

class Learner:
    """One asympo-learner process on `port` (tiny model, 16 tokens), its log
    under WORK."""
    starts = 0

    def __init__(self, port, *flags):
        Learner.starts += 1
        self.log = os.path.join(WORK, "learner-%d.log" % Learner.starts)
        self.proc = subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % port, "--metrics_address=",
                                      "--model=tiny", "--tiny_vocab_size=16", "--threads=1"] + list(flags),
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        if sig == signal.SIGTERM:
            check(code == 0, "the learner exits cleanly (%s)" % self.log)


def groups(n, tag, responses=2, length=2):
    """n prompt groups of `responses` responses of `length` tokens; their
    bytes differ with `tag`."""
    seed = sum(map(ord, tag))
    return [asympo_rl.group([1, 2 + (seed + g) % 14], [([(seed + g + r + i) % 16 for i in range(length)],
                                                         float(r % 2)) for r in range(responses)],
                            prompt_id="%s-%d" % (tag, g))
            for g in range(n)]


def gives_up_in_time(what, call, target, bound):
    t0 = time.monotonic()
    try:
        call()
        check(False, "%s: no learner, yet it returned" % what)
    except asympo_rl.LearnerUnavailableError as e:
        took, msg = time.monotonic() - t0, str(e)
        check(took < bound, "%s gives up after %.2f s (under %.1f s): %s" % (what, took, bound, msg))
        check(target in msg and "attempt" in msg and " s " in msg,
              "%s: the error names the target, the attempts and the seconds waited" % what)
        check(e.attempts >= 1, "%s: the error carries its attempts (%d)" % (what, e.attempts))


def scenario_deadline():
    target = "127.0.0.1:%d" % free_port()  # nothing listens there
    checked = asympo_rl.LearnerClient(target, source="deadline", timeout=60, retry_deadline=2)
    raw = asympo_rl.LearnerClient(target, source="deadline", timeout=60, retry_deadline=2, validate=False)
    gives_up_in_time("status()", checked.status, target, 3.5)
    gives_up_in_time("submit() with validation", lambda: checked.submit(groups(1, "v")), target, 3.5)
    gives_up_in_time("submit()", lambda: raw.submit(groups(1, "r")), target, 3.5)
    gives_up_in_time("submit_stream()", lambda: raw.submit_stream([groups(1, "s%d" % i) for i in range(3)]),
                     target, 3.5)


def main():
    os.makedirs(WORK, exist_ok=True)
    {"deadline": scenario_deadline}[SCENARIO]()


if __name__ == "__main__":
    main()
