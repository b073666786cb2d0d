#!/usr/bin/env python3
"""Writes the generated part of docs/results.md (between its claims
markers) from the result files of bench/claims_experiment.py, judged by
the rules of docs/method.md ("Deciding the paper's claims"; the verdicts
are bench/claims_verdicts.py's): the verdicts in one table, the base, every
cell, the noise floor, the three claims, the spreads, the drift and the
mechanism, VeRL's batch structure, the second size, the earlier 3-seed
grid read by the same rules, and the wall clock. Every figure between the
markers comes from the files (the JSON results, the per-step rows in
csv/, the base's reports); the prose around them has none. Cells still
running are said to be missing, never guessed.

    python3 bench/claims_report.py [--out docs/results/claims-10seeds] [--large docs/results/claims-large]
        [--earlier docs/results/claims] [--doc docs/results.md] [--lr 3e-5] [--lags 0,4,16] [--k 8]
        [--seeds 10]
"""
import argparse
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import claims_advice as ca  # noqa: E402
import claims_stats as cs  # noqa: E402
import claims_verdicts as cv  # noqa: E402
from claims_experiment import CLAIM_OBJECTIVES, OBJECTIVES, base_check, read_json  # noqa: E402

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
LARGE_LAG = 16  # the second size is compared with the first at this lag


def mean(values):
    values = [v for v in values if v is not None and v == v]
    return statistics.mean(values) if values else float("nan")


def mean_sd(values, digits=3):
    """Mean ± sd, skipping a run without the measure (None or NaN); a half
    rounded as claims_stats.decimal_text does."""
    values = [v for v in values if v is not None and v == v]
    if not values:
        return "-"
    if len(values) == 1:
        return cs.decimal_text(values[0], digits)
    return "%s ± %s" % (cs.decimal_text(statistics.mean(values), digits),
                        cs.decimal_text(statistics.stdev(values), digits))


def runs_of(cells, objective, lag):
    return [cells[(objective, lag)][s] for s in sorted(cells.get((objective, lag), {}))]


def shown_command(command):
    """A recorded command as the page shows it: the program relative to its
    build tree (build/bench/task_learning), whichever tree ran it."""
    program, _, rest = command.partition(" ")
    if program.endswith("/bench/task_learning"):
        program = "build/bench/task_learning"
    return (program + " " + rest).rstrip()


def base_section(out, k):
    path = os.path.join(out, "base", "base.json")
    if not os.path.exists(path):
        return ["**The base**: not made yet.", ""]
    base = read_json(path)
    s, r = base["s_g"], base["inverse_s_ratio"]
    lines = ["**The base** (`%s`, %.0f s): supervised training stopped at step %d with greedy accuracy %.3f "
             "(target %.2f) on its own check; S_g over %d sampled responses: median %.3f nats (p10 %.3f, "
             "p90 %.3f); within a group the largest 1/S_g is %.2f times the smallest (median; p90 %.2f). "
             "Check before RL: %s." % (
                 shown_command(base["command"]), base["seconds"], base["sft"]["steps"], base["sft"]["greedy_acc"],
                 base["sft"]["target"], base["responses"], s["median"], s["p10"], s["p90"], r["median"], r["p90"],
                 base_check(base)[1])]
    ev = os.path.join(out, "base", "eval.json")
    if os.path.exists(ev):
        e = read_json(ev)
        lines[0] += (" `asympo-eval` on %d held-out problems (`base/eval.json`): greedy %.3f, mean@%d %.3f, "
                     "pass@%d %.3f, mean length %.1f tokens." % (
                         e["prompts"], e["greedy_accuracy"], e["k"], e["mean_at_k"], e["k"], e["pass_at_k"],
                         e["mean_length"]))
    return lines + [""]


def grid_table(cells, lags, k, objectives):
    """Per objective and lag, over seeds: the final evaluation, the reward's
    peak and end, the drift and the mechanism's measures."""
    lines = ["| objective | lag | runs | mean@%d | greedy | pass@%d | final reward | peak reward | runs peaking "
             "in the last 20 steps | behavior KL | S_P first → last | S_N first → last | degenerate first → last | "
             "order entropy first → "
             "last |" % (k, k),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for o in objectives:
        for g in lags:
            rs = runs_of(cells, o, g)
            if not rs:
                continue
            late = sum(1 for r in rs if "rewards" in r and peak_step(r["rewards"]) >= len(r["rewards"]) - 20)
            deg, pos, neg = ([r["trajectory"][c] for r in rs] for c in ("degenerate_fraction", "s_pos", "s_neg"))
            lines.append("| `%s` | %d | %d | %s | %s | %s | %s | %s | %d | %s | %.3f → %.3f | %.3f → %.3f | %.2f → %.2f "
                         "| %.2f → %.2f |" % (
                o, g, len(rs), mean_sd([r["eval"].get("mean@%d" % k) for r in rs]),
                mean_sd([r["eval"].get("greedy_acc") for r in rs]), mean_sd([r["eval"].get("pass@%d" % k) for r in rs]),
                mean_sd([r["final_reward20"] for r in rs]), mean_sd([r["peak_reward20"] for r in rs]), late,
                "-" if g == 0 and not any(r.get("minibatches", 1) > 1 for r in rs) else
                mean_sd([r["behavior_kl"] for r in rs], 4),
                mean([d[0] for d in pos]), mean([d[1] for d in pos]), mean([d[0] for d in neg]), mean([d[1] for d in neg]),
                mean([d[0] for d in deg]), mean([d[1] for d in deg]),
                mean([r["order_entropy_first"] for r in rs]), mean([r["order_entropy_last"] for r in rs])))
    return lines + [""]


def peak_step(rewards, window=20):
    """The index of the last step whose `window`-step mean is the run's highest."""
    means = [statistics.mean(rewards[max(0, i - window + 1):i + 1]) for i in range(len(rewards))]
    best = max(means)
    return max(i for i, m in enumerate(means) if m == best)


def drift(cells, lags):
    """asympo's mean token drift against grpo's and spo's at each stale lag."""
    lines = []
    for g in lags:
        kl = {o: mean([r["behavior_kl"] for r in runs_of(cells, o, g)]) for o in ("asympo", "grpo", "spo")}
        if g == 0 or any(v != v for v in kl.values()):
            continue
        lines.append("- lag %d: `asympo` %.4f nats per token, %.1f times `spo`'s (%.4f) and %.1f times `grpo`'s "
                     "(%.4f)." % (g, kl["asympo"], kl["asympo"] / kl["spo"], kl["spo"], kl["asympo"] / kl["grpo"],
                                  kl["grpo"]))
    return ["**The drift** between the weights that sampled and the weights that train (mean token KL over "
            "the second half of each run, mean over seeds):"] + (lines or ["- not measured yet"]) + [""]


def claim_line(per):
    return "; ".join("lag %d: %s" % (g, cv.interval_text(m, low, high, n, short=True))
                     for g, m, low, high, n, _ in per)


def summary(cells, lags, claim1, base):
    """The verdicts in one table, with the intervals that decide them;
    `claim1` is claims_verdicts.claim1's answer (None without the base's
    evaluation, `base`)."""
    stale = [g for g in lags if g > 0]
    rows = ["| claim | verdict | what decides it (differences in points of mean@8, 95% intervals) |",
            "| --- | --- | --- |"]
    if claim1 is not None:
        _, verdict, counts = claim1
        collapsing, stable_cells = cv.claim1_cells(lags)
        falls = []
        for c in collapsing:
            timing = cv.fall_timing(cells, c, base)
            falls.append("`%s` at lag %d: %s" % (c + ((
                "%d of %d collapsed" % counts[c][:2] + (", " + cv.timing_text(timing) if timing else ""))
                if c in counts else "not on file yet",)))
        stable = [counts[c][:2] for c in stable_cells if c in counts]
        falls.append("`grpo`, `spo`, `asympo` under staleness: %d of %d%s" % (
            sum(x for x, _ in stable), sum(n for _, n in stable),
            " (%d of their %d cells on file)" % (len(stable), len(stable_cells))
            if len(stable) < len(stable_cells) else ""))
        rows.append("| 1. `naive` and `gpg` collapse under staleness; `grpo`, `spo`, `asympo` do not | **%s** | %s |" % (
            verdict, "; ".join(falls)))
    per, verdict = cv.judge_claim(cells, "asympo", "grpo", stale)
    rows.append("| 2. `asympo` within 2 points of `grpo` at lags %s | **%s** | `asympo` - `grpo`: %s |" % (
        " and ".join(map(str, stale)), verdict, claim_line(per)))
    per, verdict = cv.judge_claim(cells, "asympo", "spo", lags)
    rows.append("| 3. `asympo` within 2 points of `spo` at every lag | **%s** | `asympo` - `spo`: %s; pooled under "
                "staleness: %s |" % (verdict, claim_line(per), cv.sign_test(cells, "asympo", "spo", stale)))
    return rows + [""]


def size_section(small, large, lr, k):
    """The second size: its cells, and asympo's gaps at LARGE_LAG against the
    first size's (`small`, its cells), by the rule of docs/method.md ("The
    second size")."""
    cells = cv.load(large, lr, k)
    if not cells:
        return ["**The second size**: no run yet (`%s`)." % large, ""]
    lags = sorted({g for (_, g) in cells}, reverse=True)
    lines = ["**The second size** (`%s`):" % large, ""] + base_section(large, k)
    lines += grid_table(cells, lags, k, CLAIM_OBJECTIVES)
    for b in ("grpo", "spo"):
        gaps = {}
        for name, c in (("first", small), ("second", cells)):
            x, y = cv.scores(c, "asympo", LARGE_LAG), cv.scores(c, b, LARGE_LAG)
            gaps[name] = [x[s] - y[s] for s in sorted(set(x) & set(y))]
        m, low, high = cs.welch_interval(gaps["second"], gaps["first"])
        if m is None:
            lines.append("- `asympo` - `%s` at lag %d: not on file at both sizes yet." % (b, LARGE_LAG))
            continue
        said = "undetermined"
        if low is not None:
            said = ("holds" if low >= -cv.TOLERANCE and high <= cv.TOLERANCE else "gains" if low > 0
                    else "loses" if high < 0 else "undetermined")
        verdict = "**undetermined**" if said == "undetermined" else "`asympo` **%s** with size" % said
        lines.append("- `asympo` - `%s` at lag %d: %.1f points at the first size (%s), %.1f at the second (%d); "
                     "the change %s: %s." % (
                         b, LARGE_LAG, mean(gaps["first"]), cv.seed_pairs(len(gaps["first"])), mean(gaps["second"]),
                         len(gaps["second"]), cv.interval_text(m, low, high, short=True), verdict))
    return lines + [""]


def earlier_section(earlier, k):
    """The earlier 3-seed grid (docs/results/claims, lr 3e-5) read by the rules."""
    cells = cv.load(earlier, 3e-5, k)
    if not cells:
        return []
    (m, low, high, n), sd = cv.noise_floor(cells)
    lines = ["**The earlier grid** (`%s`, 3 seeds a cell at lr 3e-5, from a base that was not kept) read by the "
             "same rules:" % earlier]
    for a, b, lags in (("asympo", "grpo", [4, 16]), ("asympo", "spo", [0, 4, 16])):
        per, verdict = cv.judge_claim(cells, a, b, lags)
        lines.append("- `%s` - `%s`: %s: **%s**." % (a, b, claim_line(per), verdict))
    lines.append("- Under staleness %s; the noise floor (`grpo` - `naive`, lag 0) %s, per-seed sd %.1f." % (
        cv.sign_test(cells, "asympo", "spo", [4, 16]), cv.interval_text(m, low, high, n, short=True),
        sd if sd is not None else float("nan")))
    return lines + [""]


def mechanism_section(cells, earlier, k):
    """The 1/S_g weighting on both tasks at lag 0: add from the base (this
    grid) and copy from random weights (the earlier experiment's copy phase)."""
    lines = ["**The mechanism on both tasks** (lag 0, mean over seeds; degenerate: groups of equal rewards over "
             "steps 331-350; NLL and S_P: the last 50 steps; accuracy at NLL < 1: the 20-step training accuracy "
             "when the mean token NLL first fell below 1, which add starts below; order entropy: add's operand "
             "orders within a group, first 20 steps → last 20):", "",
             "| task | objective | runs | greedy | mean@%d | degenerate 331-350 | mean NLL | S_P | accuracy at NLL < 1 "
             "| order entropy first → last |" % k,
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]

    def row(task, o, rs):
        if not rs:
            return
        t = [r["trajectory"] for r in rs]
        below = [x["nll_below_1"]["accuracy20"] for x in t if x.get("nll_below_1")]
        first = [r.get("order_entropy_first") for r in rs]
        entropy = "-" if mean(first) != mean(first) else "%.2f → %.2f" % (
            mean(first), mean([r.get("order_entropy_last") for r in rs]))
        lines.append("| %s | `%s` | %d | %s | %s | %s | %.3f | %.3f | %s | %s |" % (
            task, o, len(rs), mean_sd([r["eval"].get("greedy_acc") for r in rs], 2),
            mean_sd([r["eval"].get("mean@%d" % k) for r in rs], 2), mean_sd([x.get("degenerate_350") for x in t], 2),
            mean([x["mean_nll"][1] for x in t]), mean([x["s_pos"][1] for x in t]), mean_sd(below, 2), entropy))
    for o in ("grpo", "spo", "asympo"):
        row("add", o, runs_of(cells, o, 0))
    copy = [read_json(p) for p in sorted(glob.glob(os.path.join(earlier, "copy", "*.json")))]
    for o in OBJECTIVES:
        row("copy", o, sorted((r for r in copy if r["objective"] == o), key=lambda r: r["seed"]))
    return lines + ["", "(copy: `%s/copy/`, its commands in the files.)" % earlier, ""]


def wall_section(out, large):
    lines = ["**Wall clock** (this 2-core machine: two runs at a time, three once the second size ran beside "
             "the first; a run's seconds grow with the runs beside it):", "",
             "| runs | count | median per run (s) | in all (h) |", "| --- | ---: | ---: | ---: |"]
    total = 0.0
    for name, folder in (("lag 0", os.path.join(out, "sweep")), ("lags 4 and 16", os.path.join(out, "grid")),
                         ("VeRL's batch structure", os.path.join(out, "batches")),
                         ("the second size", os.path.join(large, "grid")),
                         ("the second size, lag 0", os.path.join(large, "sweep"))):
        secs = [read_json(p)["seconds"] for p in glob.glob(os.path.join(folder, "*.json"))]
        if secs:
            total += sum(secs)
            lines.append("| %s | %d | %.0f | %.1f |" % (name, len(secs), statistics.median(secs), sum(secs) / 3600))
    return lines + ["| all | | | %.1f |" % (total / 3600), ""]


def render(a, cells, base):
    lags, stale = a.lags, [g for g in a.lags if g > 0]
    planned = len(OBJECTIVES) * len(lags) * a.seeds
    on_file = sum(len(c) for c in cells.values())
    floor, floor_sd = cv.noise_floor(cells)
    claim1 = cv.claim1(cells, lags, base) if base is not None else None
    lines = [BEGIN, "Generated by `python3 bench/claims_report.py` from `%s`: %d of the grid's %d runs on file "
             "(%d objectives, lags %s, %d seeds, lr %g); the rules are docs/method.md's." % (
                 a.out, on_file, planned, len(OBJECTIVES), ", ".join(map(str, lags)), a.seeds, a.lr), ""]
    lines += summary(cells, lags, claim1, base) + base_section(a.out, a.k)
    lines += ["**Every cell** (mean ± sd over seeds; final and peak: the 20-step mean training reward; KL: the "
              "second half; S_P and S_N: the mean token NLL of positive and of negative responses, and degenerate: "
              "groups of equal rewards, each the first 20 steps → the last 50; operand-order "
              "entropy within a group, the first 20 steps → the last 20):", ""]
    lines += grid_table(cells, lags, a.k, OBJECTIVES)
    lines += ["**The noise floor** (`grpo` - `naive` at lag 0): %s; per-seed sd %s." % (
        cv.interval_text(*floor, short=True), "%.1f" % floor_sd if floor_sd is not None else "unknown"), ""]
    lines += ["**Claim 2**, per lag:"] + cv.claim(cells, "asympo", "grpo", stale, floor_sd) + [""]
    lines += ["**Claim 3**, per lag:"] + cv.claim(cells, "asympo", "spo", lags, floor_sd) + [""]
    lines += ["**Spreads across seeds**:"] + cv.spreads(cells, lags) + [""]
    if claim1 is not None:
        lines += ["**Claim 1**, every run judged over its whole run from its rows (a fall from a peak above the "
                  "base's mean@%d, %.3f, to below half of it for 20 steps; the steps of the falls in brackets):" % (
                      a.k, base), ""] + claim1[0] + [""]
    lines += drift(cells, lags) + mechanism_section(cells, a.earlier, a.k)
    bcells = cv.load(a.out, a.lr, a.k, folders=("batches",))
    if bcells:
        lines += cv.batches_section(a.out, a.lr, a.k, base, floor_sd, bcells)[1:] + ["", "Its cells in full:", ""]
        lines += grid_table(bcells, sorted({g for (_, g) in bcells}), a.k, cv.batch_objectives(bcells))
    lines += size_section(cells, a.large, a.lr, a.k) + earlier_section(a.earlier, a.k) + wall_section(a.out, a.large)
    return "\n".join(lines + [END])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/claims-10seeds", help="claims_experiment.py's --out")
    ap.add_argument("--large", default="docs/results/claims-large", help="the second size's --out")
    ap.add_argument("--earlier", default="docs/results/claims", help="the earlier 3-seed grid")
    ap.add_argument("--doc", default="docs/results.md", help="the page whose claims markers are replaced")
    ap.add_argument("--method", default="docs/method.md", help="the page whose choosing markers are replaced")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--lags", default="0,4,16")
    ap.add_argument("--k", type=int, default=8, help="the k of mean@k (the runs' --eval_prompts_k)")
    ap.add_argument("--seeds", type=int, default=10, help="the seeds a cell is planned with")
    a = ap.parse_args()
    a.lags = [int(x) for x in a.lags.split(",") if x]
    cells = cv.load(a.out, a.lr, a.k)
    base = cv.base_mean(a.out)
    pages = [splice(a.doc, BEGIN, END, render(a, cells, base)),
             splice(a.method, ca.BEGIN, ca.END, "\n".join(ca.render(cells, a.lags, base, a.earlier, a.k, a.out)))]
    for doc, page in zip((a.doc, a.method), pages):  # both pages checked before either is written
        with open(doc + ".tmp", "w") as f:
            f.write(page)
        os.replace(doc + ".tmp", doc)
        print("wrote %s" % doc)


def splice(doc, begin, end, text):
    """The page with what lies between its markers (markers included)
    replaced by text; exits, naming the page, when it has no markers."""
    with open(doc) as f:
        page = f.read()
    if begin not in page or end not in page:
        sys.exit("claims_report: %s has no %s ... %s markers" % (doc, begin, end))
    head, rest = page.split(begin, 1)
    return head + text + rest.split(end, 1)[1]

if __name__ == "__main__":
    main()
