#!/usr/bin/env python3
"""Turns what deploy/gpu_check.sh left into one report, gpu_report.md and
gpu_report.json. Several result folders (the parts of the check, each run on
its own machine and brought back from it) merge into one report; where two
folders hold the same figure, the later folder's wins.

    deploy/gpu_report.py DIR                      # report written into DIR
    deploy/gpu_report.py DIR1 DIR2 ... --out DIR  # merged, written into DIR

A folder may hold: facts-PART.json (the machine, per part; facts.json from
older checks), steps.jsonl (every step: status, seconds, timeout),
gpu_tests.out or gpu_tests.log (ctest's output), bench.jsonl (one JSON
object per benchmark run, tagged with "case" and "impl"), publish_steps.md,
and loop/steps.csv (the short real loop).
"""
import argparse
import csv
import json
import os
import re
import sys


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    return out


# A test's line in ctest's closing list: "  7 - Suite.Name (Failed)", then
# the test's labels when it has any ("\t 26 - HfLogitsOnGpu (Failed)    gpu",
# as ctest 3.28 wrote it on a GPU node). The reason in parentheses may hold
# spaces ("Subprocess aborted", "Not Run").
FAILED_LINE = re.compile(r"^\s*\d+ - (\S+) \(([^()]+)\)(?:\s+\S.*)?\s*$")
SUMMARY = re.compile(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)")
SKIPPED = re.compile(r"\*\*\*Skipped")


def ctest_summary(path):
    """{"total", "failed", "skipped", "failed_tests": [{"name", "reason"}]},
    {"summary": why there is none}, or None when there is no log."""
    if not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    failed, in_list = [], False
    for line in text.splitlines():
        if line.startswith("The following tests FAILED"):
            in_list = True
            continue
        if in_list:
            m = FAILED_LINE.match(line)
            if m:
                failed.append({"name": m.group(1), "reason": m.group(2)})
            elif line.strip():
                in_list = False
    m = SUMMARY.findall(text)
    if not m:
        if "No tests were found" in text:
            return {"summary": "no tests were found (%s)" % os.path.basename(path)}
        return {"summary": "no result (see %s)" % os.path.basename(path), "failed_tests": failed}
    _, nfail, total = m[-1]
    return {"total": int(total), "failed": int(nfail), "skipped": len(SKIPPED.findall(text)),
            "failed_tests": failed}


def loop_summary(d):
    path = os.path.join(d, "steps.csv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {"steps": 0}
    r = [float(x["reward_mean"]) for x in rows]
    tps = sorted(float(x["tokens_per_s"]) for x in rows)
    first, last = r[:20], r[-20:]
    return {"steps": len(rows), "seconds": float(rows[-1]["time_s"]),
            "reward_first20": sum(first) / len(first), "reward_last20": sum(last) / len(last),
            "median_tokens_per_s": tps[len(tps) // 2]}


def collect(dirs):
    """Everything the folders hold, later folders overriding earlier ones."""
    facts, steps, bench = {}, {}, {}
    tests = loop = publish = None
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if name == "facts.json" or (name.startswith("facts-") and name.endswith(".json")):
                f = read_json(os.path.join(d, name))
                if isinstance(f, dict):
                    facts[f.get("part", "all")] = f
        for s in read_jsonl(os.path.join(d, "steps.jsonl")):
            steps[(s.get("part"), s.get("step"))] = s
        for b in read_jsonl(os.path.join(d, "bench.jsonl")):
            bench[(b.get("case"), b.get("impl"))] = b
        for log in ("gpu_tests.out", "gpu_tests.log"):
            t = ctest_summary(os.path.join(d, log))
            if t is not None:
                tests = t
                break
        loop = loop_summary(os.path.join(d, "loop")) or loop
        p = os.path.join(d, "publish_steps.md")
        if os.path.exists(p) and os.path.getsize(p):
            with open(p) as f:
                publish = f.read().strip()
    return facts, list(steps.values()), list(bench.values()), tests, loop, publish


def fmt(v, spec):
    return spec % v if isinstance(v, (int, float)) else "-"


def render(dirs):
    facts, steps, bench, tests, loop, publish = collect(dirs)
    report = {"sources": dirs, "facts": facts, "steps": steps, "gpu_tests": tests, "benchmarks": bench,
              "loop": loop, "comparisons": []}
    md = ["# GPU node report", ""]
    for part, f in facts.items():
        md.append("- %s: %s" % (part, ", ".join("%s %s" % (k, v) for k, v in f.items()
                                                 if k != "part" and v not in ("", None))))
    md += ["", "## Steps", "", "| part | step | status | seconds | timeout |", "| --- | --- | --- | ---: | ---: |"]
    for s in steps:
        md.append("| %s | %s | %s | %s | %s |" % (s.get("part"), s.get("step"), s.get("status"),
                                                  s.get("seconds"), s.get("timeout_s")))
    if not steps:
        md.append("| - | no step ran | | | |")
    md += ["", "## GPU-labelled tests", ""]
    if tests and "total" in tests:
        md.append("- %d tests, %d failed, %d skipped" % (tests["total"], tests["failed"], tests["skipped"]))
    else:
        md.append("- %s" % ((tests or {}).get("summary") or "not run"))
    for t in (tests or {}).get("failed_tests", []):
        md.append("- failed: %s (%s)" % (t["name"], t["reason"]))

    by_case = {}
    for b in bench:
        by_case.setdefault(b.get("case"), {})[b.get("impl")] = b
    md += ["", "## Training step (bf16 compute, fp32 masters and AdamW)", "",
           "| case | C++ tokens/s | C++ MFU | PyTorch tokens/s | PyTorch MFU | ratio | target |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for case, impls in sorted(by_case.items(), key=lambda kv: str(kv[0])):
        if not str(case).startswith("train"):
            continue
        c, p = impls.get("cpp"), impls.get("pytorch")
        ratio = c["tokens_per_s"] / p["tokens_per_s"] if c and p and p.get("tokens_per_s") else None
        ok = ratio is not None and ratio >= 1.0 and c.get("mfu", 0) >= 0.35
        report["comparisons"].append({"case": case, "ratio": ratio, "mfu": c and c.get("mfu"), "target_met": ok})
        md.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            case, fmt(c and c.get("tokens_per_s"), "%.0f"), fmt(c and c.get("mfu"), "%.3f"),
            fmt(p and p.get("tokens_per_s"), "%.0f"), fmt(p and p.get("mfu"), "%.3f"), fmt(ratio, "%.2fx"),
            "met" if ok else "NOT met (>= 1.0x and MFU >= 0.35)" if ratio else "-"))
    md += ["", "## Generation (bf16, 512 new tokens, sampled)", "",
           "| case | C++ tokens/s | transformers static cache tokens/s | ratio | target |",
           "| --- | ---: | ---: | ---: | --- |"]
    for case, impls in sorted(by_case.items(), key=lambda kv: str(kv[0])):
        if not str(case).startswith("generate"):
            continue
        c, p = impls.get("cpp"), impls.get("transformers")
        ratio = c["tokens_per_s"] / p["tokens_per_s"] if c and p and p.get("tokens_per_s") else None
        ok = ratio is not None and ratio >= 2.0
        report["comparisons"].append({"case": case, "ratio": ratio, "target_met": ok})
        md.append("| %s | %s | %s | %s | %s |" % (
            case, fmt(c and c.get("tokens_per_s"), "%.0f"), fmt(p and p.get("tokens_per_s"), "%.0f"),
            fmt(ratio, "%.2fx"), "met" if ok else "NOT met (>= 2x)" if ratio else "-"))
    md += ["", "## Weights: snapshot parts per billion bf16 parameters", ""]
    weights = 0
    for b in bench:
        if b.get("mode") == "transfer" and isinstance(b.get("per_billion_s"), dict):
            weights += 1
            md.append("- %s (%s parameters, pinned host buffer: %s): %s" % (
                b.get("config"), b.get("params"), b.get("pinned"),
                ", ".join("%s %.3f s" % (k, v) for k, v in b["per_billion_s"].items()
                          if isinstance(v, (int, float)) and v >= 0)))
        if b.get("case") == "grpc_wire":
            weights += 1
            cells = zip(b.get("columns", []), b.get("row", []))
            md.append("- gRPC wire (broadcast_bench, loopback): %s"
                      % (", ".join("%s %s" % (c, v) for c, v in cells) or b.get("line", "")))
    if not weights:
        md.append("- not run")
    md += ["", "## Trainer step with --broadcast_every 1", "", publish or "not run"]
    md += ["", "## Short real loop (learner + one rollout on the GPU, tiny model, copy task)", ""]
    if loop:
        md.append("- " + ", ".join("%s %s" % (k, ("%.3f" % v) if isinstance(v, float) else v) for k, v in loop.items()))
    else:
        md.append("- not run")
    return report, "\n".join(md) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Write gpu_report.md and gpu_report.json from the result folders of "
                    "deploy/gpu_check.sh (one per part or machine; later folders win).")
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="a folder of gpu_check results")
    ap.add_argument("--out", help="where to write the report (default: DIR, when there is one)")
    ap.add_argument("--quiet", action="store_true", help="do not print the report")
    a = ap.parse_args(argv)
    for d in a.dirs:
        if not os.path.isdir(d):
            ap.error("%s: not a folder" % d)
    if a.out is None:
        if len(a.dirs) > 1:
            ap.error("several folders merge into one report: give --out DIR")
        a.out = a.dirs[0]
    os.makedirs(a.out, exist_ok=True)
    report, md = render(a.dirs)
    with open(os.path.join(a.out, "gpu_report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "gpu_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    if not a.quiet:
        sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
