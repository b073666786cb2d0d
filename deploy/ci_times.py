#!/usr/bin/env python3
"""The times of a ctest run by label, for the end of every test run
(deploy/run_tests.sh, .ci/run; the legs themselves are timed by
deploy/ci_legs.sh).

    ci_times.py ctest BUILD_DIR LOG   per-label times of the run whose
                                      output is LOG
    ci_times.py failures LOG          why each failed test of LOG failed, a
                                      few lines each (the end of a CI run)

Each label's line sums the seconds of its tests (tests run side by side,
so the sums exceed the wall time) and names its slowest test; the ten
slowest tests follow. A failed test's reason is its output's FAIL lines
(ctest --output-on-failure prints the output after the result line), else
its last lines.
"""
import collections
import json
import re
import subprocess
import sys

RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (.+?) \.+\s*\**(\S.*?)\s+([\d.]+) sec\s*$")


def short(name):
    """A test's name without gtest's parameter text ("  # GetParam() = ...")."""
    return name.split("  #")[0].strip()


def fmt(seconds):
    seconds = int(round(seconds))
    return "%dm%02ds" % (seconds // 60, seconds % 60)


def labels_of(build_dir):
    out = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"],
                         capture_output=True, text=True, check=True).stdout
    labels = {}
    for test in json.loads(out).get("tests", []):
        names = []
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                names = prop.get("value") or []
        labels[short(test["name"])] = names or ["(none)"]
    return labels


def ctest(build_dir, log):
    labels = labels_of(build_dir)
    results = []
    for line in open(log, encoding="utf-8", errors="replace"):
        m = RESULT.match(line)
        if m:
            results.append((short(m.group(1)), m.group(2).strip(), float(m.group(3))))
    if not results:
        print("ci_times: no test results in %s" % log)
        return
    by_label = collections.defaultdict(list)
    for name, status, seconds in results:
        for label in labels.get(name, ["(none)"]):
            by_label[label].append((seconds, name, status))
    print("== ctest by label (seconds summed over tests; they run side by side) ==")
    for label in sorted(by_label, key=lambda k: -sum(s for s, _, _ in by_label[k])):
        rows = by_label[label]
        slowest = max(rows)
        failed = sum(1 for _, _, st in rows if st not in ("Passed", "Skipped"))
        print("  %-12s %4d tests %8s  slowest %s (%.0f s)%s" %
              (label, len(rows), fmt(sum(s for s, _, _ in rows)), slowest[1], slowest[0],
               "  %d not passed" % failed if failed else ""))
    print("== the ten slowest tests ==")
    for seconds, name, status in sorted(((s, n, st) for n, st, s in results), reverse=True)[:10]:
        print("  %7.1f s  %s  %s" % (seconds, name, status))


def failures(log, per_test=3, most=12):
    """Prints each failed test of `log` with its FAIL lines (or last lines)."""
    blocks, current = [], None
    for line in open(log, encoding="utf-8", errors="replace"):
        m = RESULT.match(line)
        if m or re.match(r"^\s*Start\s+\d+: ", line):
            current = None
            if m and m.group(2).strip() not in ("Passed", "Skipped"):
                current = (short(m.group(1)), m.group(2).strip(), [])
                blocks.append(current)
            continue
        if current is not None and line.strip():
            current[2].append(line.rstrip()[:200])
    for name, status, lines in blocks[:most]:
        why = ([l for l in lines if re.search(r"\bFAIL|Failure", l)] or
               [l for l in lines if "error" in l.lower()] or lines[-per_test:])
        print("%s (%s)" % (name, status))
        for l in why[:per_test]:
            print("    " + l.strip())
    if len(blocks) > most:
        print("... and %d more" % (len(blocks) - most))


USAGE = "usage: ci_times.py ctest BUILD_DIR LOG | failures LOG"


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(USAGE)
        print(__doc__)
    elif len(argv) == 4 and argv[1] == "ctest":
        ctest(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "failures":
        failures(argv[2])
    else:
        print(USAGE, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
