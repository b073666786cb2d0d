"""deploy/ci_times.py's failure digest on a made-up ctest log: only the
failed tests, each with its FAIL lines (or its error lines, or its last
lines), never a passing test's output.

    python3 ci_times_test.py SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile

SRC = os.path.abspath(sys.argv[1])
LOG = """\
    Start 1: A.ok
1/4 Test #1: A.ok .....................   Passed    1.00 sec
    Start 2: B.fail
2/4 Test #2: B.fail ...................***Failed   2.00 sec
noise before
[2026] error: a daemon's log line
FAIL: the reason
more noise
    Start 3: C.timeout
3/4 Test #3: C.timeout ................***Timeout 60.00 sec
line one
line two
last line
    Start 4: D.errors
4/4 Test #4: D.errors .................***Failed   3.00 sec
quiet
something: error: it broke
"""


def main():
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(LOG)
    out = subprocess.run([sys.executable, os.path.join(SRC, "deploy", "ci_times.py"),
                          "failures", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    want = ("B.fail (Failed)\n    FAIL: the reason\n"
            "C.timeout (Timeout)\n    line one\n    line two\n    last line\n"
            "D.errors (Failed)\n    something: error: it broke\n")
    if out != want:
        print("FAIL: the digest differs:\n%s\nwanted:\n%s" % (out, want))
        return 1
    print("ok: three failed tests, each with its reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
