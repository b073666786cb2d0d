#!/usr/bin/env python3
"""docs/method.md's "Choosing an objective", generated: the table between
its choosing markers, each row's choice made by one rule from the claims
experiment's result files, and its figures read from them.

The rule (docs/method.md states it): in a situation, the candidates are
the objectives it allows; the choice is the one with the best mean mean@k
over seeds, and beside it every other candidate whose paired 95% interval
against it reaches above -2 points (not shown to be more than 2 points
behind). No choice is made while a candidate among the claims' four
objectives has no run on file; one made on fewer than two seed pairs says
so. Called by bench/claims_report.py, which writes both pages."""
import collections
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import claims_stats as cs  # noqa: E402
import claims_verdicts as cv  # noqa: E402
from claims_experiment import CLAIM_OBJECTIVES, OBJECTIVES, read_json  # noqa: E402

BEGIN, END = "<!-- choosing:begin -->", "<!-- choosing:end -->"
NEEDS_BEHAVIOR = {"grpo"}  # objectives that need the behavior policy's log-probs


Ranking = collections.namedtuple("Ranking", "best level means undetermined missing")


def ranked(scores):
    """{objective: {seed: points}} -> Ranking: best by mean; level: the
    paired interval of o - best reaches above -TOLERANCE; undetermined:
    the candidates with fewer than 2 seed pairs with the best; missing:
    candidates with no run on file."""
    means = {o: statistics.mean(s.values()) for o, s in scores.items() if s}
    missing = [o for o, s in scores.items() if not s]
    if not means:
        return Ranking(None, [], {}, [], missing)
    best = max(means, key=lambda o: (means[o], o))
    level, undetermined = [], []
    for o in sorted(means, key=lambda o: -means[o]):
        if o == best:
            continue
        m, low, high, n = cs.paired_interval(scores[o], scores[best])
        if high is None:
            undetermined.append(o)
        elif high >= -cv.TOLERANCE:
            level.append(o)
    return Ranking(best, level, means, undetermined, missing)


def choice(r):
    """A Ranking in words: the best, the candidates level with it, and what
    is not on file yet; no choice while a candidate among the claims' four
    objectives has no run on file."""
    if r.best is None:
        return "not on file yet"
    waiting = [o for o in r.missing if o in CLAIM_OBJECTIVES]
    if waiting:
        return "not decided yet (%s not on file)" % ", ".join("`%s`" % o for o in waiting)
    text = "`%s`" % r.best
    if r.level:
        text += ", or %s (level with it)" % ", ".join("`%s`" % o for o in r.level)
    if r.undetermined:
        text += " (%s on fewer than 2 seed pairs with it)" % ", ".join("`%s`" % o for o in r.undetermined)
    return text + (" (so far: %s not on file yet)" % ", ".join("`%s`" % o for o in r.missing) if r.missing else "")


def fraction(points):
    """A mean in points (100 x mean@k) as the fraction the result files
    hold, three decimals, rounded as docs/results.md's tables round it."""
    return cs.decimal_text(points / 100, 3)


def at_lags(cells, o, lags):
    """'0.647 / 0.642 / 0.650' (mean mean@k at each lag, '-' where missing)."""
    out = []
    for g in lags:
        v = list(cv.scores(cells, o, g).values())
        out.append(fraction(statistics.mean(v)) if v else "-")
    return " / ".join(out)


def stale_row(cells, lags, candidates, situation, k):
    g = max(lags)
    scores = {o: cv.scores(cells, o, g) for o in candidates}
    r = ranked(scores)
    best, level, means = r.best, r.level, r.means
    shown = [o for o in [best] + level if o] or candidates
    measured = "mean@%d at lags %s: %s" % (
        k, ", ".join(map(str, lags)), "; ".join("`%s` %s" % (o, at_lags(cells, o, lags)) for o in shown))
    others = [o for o in candidates if o not in shown and o in means]
    if others:
        measured += "; behind at lag %d: %s" % (g, ", ".join("`%s` %s" % (o, fraction(means[o])) for o in others))
    return "| %s | %s | %s |" % (situation, choice(r), measured)


def fresh_row(cells, k):
    scores = {o: cv.scores(cells, o, 0) for o in OBJECTIVES}
    r = ranked(scores)
    best, level, means = r.best, r.level, r.means
    if best is None:
        return "| rollouts are fresh (lag 0) | not on file yet | |"
    pick = "any; `naive` is the simplest" if len(level) + 1 == len(means) == len(OBJECTIVES) else choice(r)
    return "| rollouts are fresh (lag 0) | %s | mean@%d from %s (`%s`) to %s (`%s`) |" % (
        pick, k, fraction(min(means.values())), min(means, key=means.get), fraction(means[best]), best)


def asympo_row(cells, lags):
    """The lags at which asympo and asympo_stable are level with the best of
    the claims' four objectives (a lag once the four are on file there),
    and asympo's gaps to spo and grpo at lag 0 and at the largest lag."""
    picks, parts = [], []
    rankings = {g: ranked({b: cv.scores(cells, b, g) for b in CLAIM_OBJECTIVES}) for g in lags}
    for o in ("asympo", "asympo_stable"):
        fine, not_fine = [], []
        for g, r in rankings.items():
            if not r.missing:  # a lag is judged once the four are on file there
                (fine if o == r.best or o in r.level else not_fine).append(str(g))
        if fine or not_fine:
            picks.append("`%s`%s%s" % (o, " at lag %s" % ", ".join(fine) if fine else "",
                                       "%s not at lag %s" % (";" if fine else "", ", ".join(not_fine)) if not_fine else ""))
    for g in sorted({0, max(lags)}):
        for b in ("spo", "grpo"):
            m, low, high, n = cs.paired_interval(cv.scores(cells, "asympo", g), cv.scores(cells, b, g))
            if m is not None:
                parts.append("lag %d, `asympo` - `%s`: %s" % (g, b, cv.interval_text(m, low, high, n)))
    return "| the paper's objective (`asympo`; `asympo_stable` beside it) | %s | %s |" % (
        "; ".join(picks) or "not on file yet", "; ".join(parts))


def collapse_row(cells, lags, base):
    if base is None:
        return "| stale rollouts with `naive` or `gpg` | not on file yet | |"
    stale = [g for g in lags if g > 0]
    _, counts = cv.collapse_table(cells, stale, base, ["naive", "gpg"])
    if not counts:
        return "| stale rollouts with `naive` or `gpg` | not on file yet | |"
    parts = ["`%s` lag %d: %d of %d runs collapsed" % (o, g, x, n) for (o, g), (x, n, _, _) in sorted(counts.items())]
    pick = "do not" if any(x for (x, _, _, _) in counts.values()) else "no collapse measured"
    return "| stale rollouts with `naive` or `gpg` | %s | %s |" % (pick, "; ".join(parts))


def copy_row(earlier):
    runs = [read_json(p) for p in sorted(glob.glob(os.path.join(earlier, "copy", "*.json")))]
    scores = {}
    for r in runs:
        scores.setdefault(r["objective"], {})[r["seed"]] = 100.0 * r["eval"]["greedy_acc"]
    if not scores:
        return []
    text = "; ".join("`%s` %.2f ± %.2f" % (o, statistics.mean(s.values()) / 100,
                                          statistics.stdev(s.values()) / 100 if len(s) > 1 else 0)
                     for o, s in sorted(scores.items()))
    return ["| very short responses from random weights (`copy`, `%s/copy/`) | %s | held-out greedy accuracy: %s |" % (
        earlier, choice(ranked(scores)), text)]


def daemons_row(earlier, k):
    runs = [read_json(p) for p in sorted(glob.glob(os.path.join(earlier, "daemons", "*.json")))]
    runs = [r for r in runs if "mean@%d" % k in r.get("eval", {})]
    if not runs:
        return []
    lags = [r["policy_lag"]["mean"] for r in runs if r.get("policy_lag")]  # none in a run too short to measure
    lag = ", a mean lag of %.0f versions" % statistics.mean(lags) if lags else ""
    best = max(runs, key=lambda r: r["eval"]["mean@%d" % k])
    text = "; ".join("`%s` %.3f" % (r["objective"], r["eval"]["mean@%d" % k]) for r in runs)
    return ["| real staleness through the daemons (`%s/daemons/`: the earlier base, one seed each%s) | `%s` (one seed: "
            "the direction only) | mean@%d %s |" % (earlier, lag, best["objective"], k, text)]


def lr_table(earlier, k):
    """The earlier grid's learning rates: mean@k per lr and lag, and the runs
    that fell: from a peak above the base's sampled accuracy to a final
    20-step reward below half of it (its per-step rows were not kept), or
    that never rose above the base, ending below half of it or not."""
    runs = [read_json(p) for f in ("sweep", "grid") for p in glob.glob(os.path.join(earlier, f, "*.json"))]
    cols = sorted({(r["lag"], r["lr"]) for r in runs})
    path = os.path.join(earlier, "base", "base.json")
    if not cols or not os.path.exists(path):
        return []
    base = read_json(path)["sample_accuracy"]
    lines = ["Learning rates on the earlier grid (`%s`, 3 seeds a cell, its own base, whose sampled accuracy was "
             "%.3f): mean@%d over seeds; in brackets the runs that collapsed (a peak 20-step reward above the base's, "
             "a final one below half the peak), those that never rose above the base and ended below half of it (fell "
             "from the base), and those that never rose above it:" % (earlier, base, k), "",
             "| objective | " + " | ".join("lag %d, lr %g" % c for c in cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for o in OBJECTIVES:
        row = []
        for c in cols:
            rs = [r for r in runs if r["objective"] == o and (r["lag"], r["lr"]) == c]
            fell = sum(1 for r in rs if r["peak_reward20"] > base and r["final_reward20"] < 0.5 * r["peak_reward20"])
            flat = [r["final_reward20"] < 0.5 * base for r in rs if r["peak_reward20"] <= base]
            notes = ", ".join(t for t in ("%d collapsed" % fell if fell else "",
                                          "%d fell from the base" % sum(flat) if sum(flat) else "",
                                          "%d never rose" % (len(flat) - sum(flat)) if len(flat) > sum(flat) else "")
                              if t)
            row.append("%.3f%s" % (statistics.mean(r["eval"]["mean@%d" % k] for r in rs), " (%s)" % notes if notes else "")
                       if rs else "-")
        lines.append("| `%s` | %s |" % (o, " | ".join(row)))
    return lines + [""]


def render(cells, lags, base, earlier, k, source):
    allowed = [o for o in OBJECTIVES if o not in NEEDS_BEHAVIOR]
    lines = [BEGIN, "Generated by `python3 bench/claims_report.py` from `%s` (and, where a row says so, `%s`)." % (
        source, earlier), "", "| situation | choose | measured |", "| --- | --- | --- |",
        stale_row(cells, lags, allowed, "rollouts are stale (lag %d) and carry no behavior log-probs (the daemons, "
                  "most external engines)" % max(lags), k),
        stale_row(cells, lags, OBJECTIVES, "rollouts are stale (lag %d) and behavior log-probs are available"
                  % max(lags), k)]
    if len(lags) > 2:
        mid = sorted(lags)[1]
        lines.append(stale_row(cells, [0, mid], OBJECTIVES, "a queue of a few steps (lag %d)" % mid, k))
    lines += [fresh_row(cells, k), asympo_row(cells, lags), collapse_row(cells, lags, base)]
    lines += daemons_row(earlier, k) + copy_row(earlier) + [""] + lr_table(earlier, k)
    return lines + [END]
