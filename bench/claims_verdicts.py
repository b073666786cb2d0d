#!/usr/bin/env python3
"""The paper's claims judged by docs/method.md's rules ("Deciding the
paper's claims") from one learning rate's result files: every objective's
runs at --lr under --out (sweep/ and grid/ JSON, csv/ per-step rows, and
base/eval.json), as Markdown on standard output.

    python3 bench/claims_verdicts.py [--out docs/results/claims-10seeds] [--lr 3e-5]
        [--lags 0,4,16] [--k 8]

Sections: every cell's mean@k and spread; the lag-0 noise floor (grpo
against naive); claims 2 and 3 as paired intervals against two points,
with the pooled direction of claim 3 under staleness; the spreads
compared; claim 1 from every run's own rows (collapse over the whole
run), with the exact interval of each fraction; claims 2 and 3 again in
VeRL's batch structure (batches/, with grpo_verl beside grpo) when such
runs are on file. Cells still running are counted as missing, never
guessed. The second size: the same with --out docs/results/claims-large
--lags 16,0."""
import argparse
import csv
import glob
import gzip
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import claims_stats as cs  # noqa: E402
from claims_experiment import CLAIM_OBJECTIVES, OBJECTIVES, VARIANTS  # noqa: E402
TOLERANCE = 2.0  # points of mean@k


def load(out, lr, k, folders=("sweep", "grid")):
    """{(objective, lag): {seed: run}} of the runs at `lr` in `folders`, each
    with its score (mean@k in points) and, where its rows are kept, its
    rewards."""
    cells = {}
    for path in sorted(p for f in folders for p in glob.glob(os.path.join(out, f, "*.json"))):
        with open(path) as f:
            r = json.load(f)
        if not math.isclose(r["lr"], lr, rel_tol=1e-9):
            continue
        r["score"] = 100.0 * r["eval"].get("mean@%d" % k, float("nan"))
        rows = os.path.join(out, "csv", os.path.basename(path)[:-len(".json")] + ".csv.gz")
        if os.path.exists(rows):
            with gzip.open(rows, "rt") as f:
                table = list(csv.DictReader(f))
            if [int(row["step"]) for row in table] != list(range(1, len(table) + 1)):
                raise ValueError("%s: its steps are not 1, 2, ... in order" % rows)
            r["rewards"] = [float(row["reward"]) for row in table]
        cells.setdefault((r["objective"], r["lag"]), {})[r["seed"]] = r
    return cells


def scores(cells, objective, lag):
    return {s: r["score"] for s, r in cells.get((objective, lag), {}).items()}


def cells_table(cells, lags, k, objectives=OBJECTIVES):
    lines = ["| objective | " + " | ".join("lag %d: mean@%d, points (sd, runs)" % (g, k) for g in lags) + " |",
             "| --- |" + " --- |" * len(lags)]
    for o in objectives:
        row = []
        for g in lags:
            v = list(scores(cells, o, g).values())
            row.append("%.1f (%s, %d)" % (statistics.mean(v), "%.1f" % statistics.stdev(v) if len(v) > 1 else "-",
                                          len(v)) if v else "not run yet")
        lines.append("| `%s` | %s |" % (o, " | ".join(row)))
    return lines


def seed_pairs(n):
    return "1 seed pair" if n == 1 else "%d seed pairs" % n


def interval_text(m, low, high, n=None, short=False):
    """A difference in points and its 95% interval over n seed pairs (n None:
    a Welch interval, no pairs): "-6.0 points, 95% interval [-9.4, -2.6]
    (10 seed pairs)", or "-6.0 [-9.4, -2.6] (10 seed pairs)" when short; or
    what is missing."""
    if m is None:
        return "no seed pair yet"
    head = "%+.1f" % m if short else "%+.1f points" % m
    if low is None:
        return "%s (%s)" % (head, "%s: no interval" % seed_pairs(n) if n else "no interval yet")
    return "%s%s [%+.1f, %+.1f]%s" % (head, "" if short else ", 95% interval", low, high,
                                       " (%s)" % seed_pairs(n) if n else "")


def noise_floor(cells):
    """The lag-0 gap between grpo and naive (their gradients are equal up
    to rounding there): its interval and the sd of its per-seed gaps."""
    a, b = scores(cells, "grpo", 0), scores(cells, "naive", 0)
    d = [a[s] - b[s] for s in set(a) & set(b)]
    sd = statistics.stdev(d) if len(d) > 1 else None
    return cs.paired_interval(a, b), sd


def judge_claim(cells, a, b, lags):
    """"a within TOLERANCE of b" at each of `lags`: [(lag, mean, low, high,
    n, verdict)] and the combined verdict."""
    per = []
    for g in lags:
        m, low, high, n = cs.paired_interval(scores(cells, a, g), scores(cells, b, g))
        per.append((g, m, low, high, n, cs.judge(low, high, TOLERANCE)))
    return per, cs.combine([p[5] for p in per])


def claim(cells, a, b, lags, floor_sd):
    """Lines judging "a within TOLERANCE of b" at each of `lags`, and the
    combined verdict."""
    per, combined = judge_claim(cells, a, b, lags)
    lines = []
    for g, m, low, high, n, v in per:
        if m is not None and floor_sd is not None and abs(m) < floor_sd:
            v += " (the gap is within the noise floor's sd, %.1f)" % floor_sd
        lines.append("- lag %d: `%s` - `%s` %s: **%s**" % (g, a, b, interval_text(m, low, high, n), v))
    lines.append("- Verdict: **%s**" % combined)
    return lines


def sign_test(cells, a, b, lags):
    """Two-sided sign test of a - b over every seed pair at `lags`; a tied
    pair carries no sign and is left out, and the text says so."""
    d = []
    for g in lags:
        x, y = scores(cells, a, g), scores(cells, b, g)
        d += [x[s] - y[s] for s in set(x) & set(y)]
    ties = sum(1 for v in d if v == 0)
    n, below = len(d) - ties, sum(1 for v in d if v < 0)
    if n == 0:
        return "no seed pair yet" if not ties else "%d tied seed pairs only" % ties
    tail = sum(math.comb(n, i) for i in range(min(below, n - below) + 1)) / 2.0 ** n
    p = min(1.0, 2 * tail)
    return "`%s` below `%s` in %d of %d stale seed pairs%s (sign test p = %s)" % (
        a, b, below, n, ", %d tied pair%s left out" % (ties, "" if ties == 1 else "s") if ties else "",
        "%.3f" % p if p >= 0.001 else "%.1g" % p)


def spreads(cells, lags, pairs=(("asympo", "grpo"), ("asympo", "spo"))):
    lines = []
    for g in lags:
        for a, b in pairs:
            r, low, high = cs.variance_ratio_interval(list(scores(cells, a, g).values()),
                                                      list(scores(cells, b, g).values()))
            if r is None:
                continue
            said = "larger" if low > 1 else "smaller" if high < 1 else "not distinguishable"
            lines.append("- lag %d: var(`%s`) / var(`%s`) = %.2f, 95%% interval [%.2f, %.2f]: %s" % (
                g, a, b, r, low, high, said))
    return lines or ["- not enough seeds yet"]


def collapse_table(cells, lags, base, objectives=OBJECTIVES):
    """Collapse per objective and lag, from each run's rewards: the table's
    lines and {(objective, lag): (collapsed, runs, low, high)}, with the
    interval of the collapsed fraction."""
    lines = ["| objective | " + " | ".join("lag %d: collapsed / runs, interval (fall steps)" % g for g in lags) + " |",
             "| --- |" + " --- |" * len(lags)]
    intervals = {}
    for o in objectives:
        row = []
        for g in lags:
            runs = [r for r in cells.get((o, g), {}).values() if "rewards" in r]
            if not runs:
                row.append("no rows yet")
                continue
            judged = [cs.collapse(r["rewards"], base) for r in runs]
            x, n = sum(1 for j in judged if j[0] == "collapsed"), len(judged)
            low, high = cs.fraction_interval(x, n)
            steps = sorted(j[1] for j in judged if j[1] is not None)
            row.append("%d / %d, [%.2f, %.2f]%s%s" % (
                x, n, low, high, " (%s)" % ", ".join(map(str, steps)) if steps else "",
                "; %d did not learn" % sum(1 for j in judged if j[0] == "did not learn")
                if any(j[0] == "did not learn" for j in judged) else ""))
            intervals[(o, g)] = (x, n, low, high)
        lines.append("| `%s` | %s |" % (o, " | ".join(row)))
    return lines, intervals


def claim1_cells(lags):
    """The cells claim 1 names: (naive and gpg at the largest lag, which
    collapse; grpo, spo and asympo at every stale lag, which do not)."""
    return ([(o, max(lags)) for o in ("naive", "gpg")],
            [(o, g) for o in ("grpo", "spo", "asympo") for g in lags if g > 0])


def fall_timing(cells, cell, base):
    """When the collapsed runs of `cell` fell, by docs/method.md's rule (the
    median step of the falls against the run's middle): (that median, the
    runs' length in steps, "early", "late" or "at the middle"); None when
    none fell."""
    runs = [r["rewards"] for r in cells.get(cell, {}).values() if "rewards" in r]
    steps = [s for s in (cs.collapse(rewards, base)[1] for rewards in runs) if s is not None]
    if not steps:
        return None
    median, length = statistics.median(steps), max(len(rewards) for rewards in runs)
    return median, length, "late" if median > length / 2 else "early" if median < length / 2 else "at the middle"


def timing_text(timing):
    return "%s (the falls' median step %g of %d)" % (timing[2], timing[0], timing[1])


def shape_text(cells, cell, base):
    """Where the collapsed runs of `cell` fell from, in words: the peaks'
    range and steps against the base, and how many rose above their peak
    again later; None when none fell."""
    shapes = [cs.fall_shape(r["rewards"], base) for r in cells.get(cell, {}).values() if "rewards" in r]
    shapes = [x for x in shapes if x]
    if not shapes:
        return None
    peaks, steps, again = [x[0] for x in shapes], [x[1] for x in shapes], [x[2] for x in shapes if x[2]]
    def span(values, unit):
        low, high = min(values), max(values)
        return "%s %d" % (unit, low) if low == high else "%ss %d-%d" % (unit, low, high)
    text = "from peaks of %.3f-%.3f (%s) against the base's %.3f; %d of the %d rose above their peak again later" % (
        min(peaks), max(peaks), span(steps, "step"), base, len(again), len(shapes))
    return text + (" (%s)" % span(again, "step") if again else "")


def claim1(cells, lags, base):
    """Claim 1 from the collapse table, on claim1_cells. Every one of those
    cells is needed: one without rows yet leaves the claim inconclusive. The
    lines, the verdict and collapse_table's counts."""
    lines, intervals = collapse_table(cells, lags, base)
    collapsing, stable = claim1_cells(lags)
    wanted = collapsing + stable
    verdicts = []
    for cell in wanted:
        if cell not in intervals:
            verdicts.append("inconclusive")
            continue
        _, _, low, high = intervals[cell]
        collapses = cell in collapsing
        ok = low > 0.5 if collapses else high < 0.5
        wrong = high < 0.5 if collapses else low > 0.5
        verdicts.append("confirmed" if ok else "refuted" if wrong else "inconclusive")
    verdict = cs.combine(verdicts) if intervals else "not measured yet"
    missing = [c for c in wanted if c not in intervals]
    timings = [(c, fall_timing(cells, c, base)) for c in collapsing]
    if any(t for _, t in timings):
        lines += ["", "When and from where the runs fell (the claim's \"late\", judged apart from the verdict: "
                  "the median step of the falls against the run's middle): %s." % "; ".join(
                      "`%s` at lag %d, %s, %s" % (c + (timing_text(t), shape_text(cells, c, base)))
                      for c, t in timings if t)]
    if missing and intervals:
        lines += ["", "Not on file yet: %s." % ", ".join("`%s` at lag %d" % c for c in missing)]
    lines += ["", "Verdict: **%s**" % verdict]
    return lines, verdict, intervals


def batch_objectives(cells):
    """The objectives of VeRL's batch structure on file, grpo_verl beside grpo."""
    order = CLAIM_OBJECTIVES[:1] + list(VARIANTS) + CLAIM_OBJECTIVES[1:]
    return [o for o in order if any(c[0] == o for c in cells)]


def batches_section(out, lr, k, base, floor_sd, cells=None):
    """Claims 2 and 3 again in VeRL's batch structure (batches/, or `cells`
    loaded from it), with grpo as VeRL runs it beside today's; empty when no
    such run is on file."""
    if cells is None:
        cells = load(out, lr, k, folders=("batches",))
    if not cells:
        return []
    lags = sorted({g for (_, g) in cells})
    sizes = sorted({r.get("minibatches", 1) for c in cells.values() for r in c.values()})
    objectives = batch_objectives(cells)
    lines = ["", "**VeRL's batch structure**: a batch of %s steps' prompts sampled at once by the weights of "
             "lag %s steps before, trained as that many steps in turn (`grpo_verl`: std-normalized advantages "
             "and the dual clip at 3)." % ("/".join(map(str, sizes)), "/".join(map(str, lags))), ""]
    lines += cells_table(cells, lags, k, objectives) + [""]
    lines += ["Claim 2 in this structure, against `grpo`:"] + claim(cells, "asympo", "grpo", lags, floor_sd)
    lines += ["", "and against `grpo_verl`:"] + claim(cells, "asympo", "grpo_verl", lags, floor_sd)
    lines += ["", "Claim 3 in this structure:"] + claim(cells, "asympo", "spo", lags, floor_sd)
    lines += ["", "Spreads:"] + spreads(cells, lags, (("asympo", "grpo"), ("asympo", "grpo_verl"), ("asympo", "spo")))
    if base is not None:
        lines += ["", "Collapse (the rule of claim 1):", ""] + collapse_table(cells, lags, base, objectives)[0]
    return lines


def base_mean(out):
    """The base's held-out mean@k (base/eval.json under out), None before it
    is evaluated: claim 1's bar."""
    path = os.path.join(out, "base", "eval.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["mean_at_k"]


def render(out, lr, lags, k):
    cells = load(out, lr, k)
    base = base_mean(out)
    (m, low, high, n), floor_sd = noise_floor(cells)
    stale = [g for g in lags if g > 0]
    lines = ["Every objective at lr %g; mean@%d in points (0.01); the rules of docs/method.md, "
             "\"Deciding the paper's claims\"." % (lr, k), ""]
    lines += cells_table(cells, lags, k) + [""]
    lines.append("**The noise floor** (`grpo` - `naive` at lag 0, equal gradients up to rounding): %s; "
                 "sd of the per-seed gaps %s." % (interval_text(m, low, high, n),
                                                  "%.1f" % floor_sd if floor_sd is not None else "unknown"))
    lines += ["", "**Claim 2**: `asympo` within 2 points of `grpo` at lags %s." % ", ".join(map(str, stale))]
    lines += claim(cells, "asympo", "grpo", stale, floor_sd)
    lines += ["", "**Claim 3**: `asympo` within 2 points of `spo` at every lag."]
    lines += claim(cells, "asympo", "spo", lags, floor_sd)
    lines += ["- Pooled under staleness: " + sign_test(cells, "asympo", "spo", stale)]
    lines += ["", "**Spreads across seeds**:"] + spreads(cells, lags)
    if base is None:
        lines += ["", "**Claim 1**: not judged: the base has no evaluation (base/eval.json)."]
    else:
        lines += ["", "**Claim 1**: collapse over the whole run (the 20-step mean reward from a peak above the "
                  "base's mean@%d, %.3f, to below half of it for 20 steps; the step of the fall in brackets):" % (
                      k, base), ""]
        lines += claim1(cells, lags, base)[0]
    lines += batches_section(out, lr, k, base, floor_sd)
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/results/claims-10seeds")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--lags", default="0,4,16")
    p.add_argument("--k", type=int, default=8)
    a = p.parse_args()
    sys.stdout.write(render(a.out, a.lr, [int(x) for x in a.lags.split(",")], a.k))


if __name__ == "__main__":
    main()
