"""bench/rehearsal.py refuses to start where its first runs failed at size:
on a machine with less memory and swap than its six processes need (the
kernel's OOM killer took a learner rank at its first step), and while an
earlier run's processes still use its directory (a learner still shutting
down wrote its final checkpoint into the next run's). Each refusal names
the fix and leaves the directory as it was. A kill point it cannot reach
is refused before anything starts.

    python3 rehearsal_test.py SOURCE_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        raise SystemExit(1)
    print("ok:", what)


def rehearsal(source, work, *flags):
    r = subprocess.run(["/usr/bin/python3", os.path.join(source, "bench", "rehearsal.py"),
                        "--build", "/nonexistent", "--work", work] + list(flags),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return r.returncode, r.stdout


def main():
    source, work = sys.argv[1], os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "ckpt", "ckpt-000000000002"))
    rc, out = rehearsal(source, work, "--min_memory_gib", "100000")
    check(rc != 0 and "needs about 100000" in out and "swapon" in out,
          "with too little memory and swap it refuses, naming the swap to add (%s)" % out.strip()[-200:])
    # A process of an earlier run, named by its command line.
    earlier = subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(60)",
                                os.path.join(work, "ckpt")])
    try:
        rc, out = rehearsal(source, work, "--min_memory_gib", "0")
    finally:
        earlier.kill()
        earlier.wait()
    check(rc != 0 and "still use" in out and str(earlier.pid) in out,
          "while an earlier run's process uses the directory it refuses, naming it (%s)"
          % out.strip()[-200:])
    check(os.path.isdir(os.path.join(work, "ckpt", "ckpt-000000000002")),
          "and leaves the directory as it was")
    for flags, what in ((["--kill_after", "3"], "no checkpoint of that step"),
                        (["--kill_after", "10"], "must train on")):
        rc, out = rehearsal(source, work, "--checkpoint_every", "2", "--steps", "10", *flags)
        check(rc != 0 and what in out, "%s is refused: %s" % (" ".join(flags), out.strip()[-160:]))
    print("PASS")


if __name__ == "__main__":
    main()
