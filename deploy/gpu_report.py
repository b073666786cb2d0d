#!/usr/bin/env python3
"""Turns the results of deploy/gpu_check.sh into one report: gpu_report.md
and gpu_report.json in the given directory.

    deploy/gpu_report.py LOG_DIR

Reads LOG_DIR/facts.json (machine and build), LOG_DIR/bench.jsonl (one JSON
object per benchmark run, tagged with "case" and "impl"), the ctest logs and
LOG_DIR/loop/steps.csv (the short real loop).
"""
import csv
import json
import os
import re
import sys


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def ctest_summary(path):
    if not os.path.exists(path):
        return None
    text = open(path).read()
    m = re.findall(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", text)
    skipped = len(re.findall(r"\*\*\*Skipped", text))
    failed = re.findall(r"\d+ - (\S+) \(Failed|Timeout|SEGFAULT", text)
    if not m:
        return {"summary": "no result (see %s)" % os.path.basename(path)}
    pct, nfail, total = m[-1]
    return {"total": int(total), "failed": int(nfail), "skipped": skipped, "failed_tests": failed}


def loop_summary(d):
    path = os.path.join(d, "steps.csv")
    if not os.path.exists(path):
        return None
    rows = list(csv.DictReader(open(path)))
    if not rows:
        return {"steps": 0}
    r = [float(x["reward_mean"]) for x in rows]
    tps = sorted(float(x["tokens_per_s"]) for x in rows)
    first, last = r[:20], r[-20:]
    return {"steps": len(rows), "seconds": float(rows[-1]["time_s"]),
            "reward_first20": sum(first) / len(first), "reward_last20": sum(last) / len(last),
            "median_tokens_per_s": tps[len(tps) // 2]}


def main():
    d = sys.argv[1]
    facts = json.load(open(os.path.join(d, "facts.json"))) if os.path.exists(os.path.join(d, "facts.json")) else {}
    bench = read_jsonl(os.path.join(d, "bench.jsonl"))
    report = {"facts": facts, "gpu_tests": ctest_summary(os.path.join(d, "gpu_tests.log")),
              "benchmarks": bench, "loop": loop_summary(os.path.join(d, "loop")), "comparisons": []}
    by_case = {}
    for b in bench:
        by_case.setdefault(b.get("case"), {})[b.get("impl")] = b
    md = ["# GPU node report", ""]
    for k, v in facts.items():
        md.append("- %s: %s" % (k, v))
    t = report["gpu_tests"]
    md += ["", "## GPU-labelled tests", "",
           "- %s" % (("%d tests, %d failed, %d skipped" % (t["total"], t["failed"], t["skipped"]))
                     if t and "total" in t else (t or {}).get("summary", "not run"))]
    if t and t.get("failed_tests"):
        md.append("- failed: %s" % ", ".join(t["failed_tests"]))
    md += ["", "## Training step (bf16 compute, fp32 masters and AdamW)", "",
           "| case | C++ tokens/s | C++ MFU | PyTorch tokens/s | PyTorch MFU | ratio | target |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for case, impls in sorted(by_case.items()):
        if not case or not case.startswith("train"):
            continue
        c, p = impls.get("cpp"), impls.get("pytorch")
        ratio = c["tokens_per_s"] / p["tokens_per_s"] if c and p else None
        ok = ratio is not None and ratio >= 1.0 and c.get("mfu", 0) >= 0.35
        report["comparisons"].append({"case": case, "ratio": ratio, "mfu": c and c.get("mfu"), "target_met": ok})
        md.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            case, "%.0f" % c["tokens_per_s"] if c else "-", "%.3f" % c["mfu"] if c else "-",
            "%.0f" % p["tokens_per_s"] if p else "-", "%.3f" % p["mfu"] if p else "-",
            "%.2fx" % ratio if ratio else "-", "met" if ok else "NOT met (>= 1.0x and MFU >= 0.35)"))
    md += ["", "## Generation (bf16, 512 new tokens, sampled)", "",
           "| case | C++ tokens/s | transformers static cache tokens/s | ratio | target |",
           "| --- | ---: | ---: | ---: | --- |"]
    for case, impls in sorted(by_case.items()):
        if not case or not case.startswith("generate"):
            continue
        c, p = impls.get("cpp"), impls.get("transformers")
        ratio = c["tokens_per_s"] / p["tokens_per_s"] if c and p else None
        ok = ratio is not None and ratio >= 2.0
        report["comparisons"].append({"case": case, "ratio": ratio, "target_met": ok})
        md.append("| %s | %s | %s | %s | %s |" % (
            case, "%.0f" % c["tokens_per_s"] if c else "-", "%.0f" % p["tokens_per_s"] if p else "-",
            "%.2fx" % ratio if ratio else "-", "met" if ok else "NOT met (>= 2x)"))
    md += ["", "## Weights: snapshot parts per billion bf16 parameters", ""]
    for b in bench:
        if b.get("mode") == "transfer":
            md.append("- %s (%d parameters, pinned host buffer: %s): %s" % (
                b["config"], b["params"], b["pinned"],
                ", ".join("%s %.3f s" % (k, v) for k, v in b["per_billion_s"].items() if v >= 0)))
        if b.get("case") == "grpc_wire":
            md.append("- gRPC wire (broadcast_bench, loopback): %s" % b.get("line", ""))
    md += ["", "## Trainer step with --broadcast_every 1", ""]
    steps = os.path.join(d, "publish_steps.md")
    md += [open(steps).read().strip()] if os.path.exists(steps) else ["not run"]
    loop = report["loop"]
    md += ["", "## Short real loop (learner + one rollout on the GPU, tiny model, copy task)", ""]
    if loop:
        md.append("- " + ", ".join("%s %s" % (k, ("%.3f" % v) if isinstance(v, float) else v) for k, v in loop.items()))
    else:
        md.append("- not run")
    open(os.path.join(d, "gpu_report.md"), "w").write("\n".join(md) + "\n")
    json.dump(report, open(os.path.join(d, "gpu_report.json"), "w"), indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    main()
