#!/usr/bin/env python3
"""Writes the generated part of docs/results.md (between its claims
markers) from the result files of bench/claims_experiment.py: the base, the
learning-rate sweep, the grid at the shared learning rate, each objective at
its own, the three claims checked with their rules, the mechanism on add
and copy, the cross-check through the daemons and the wall clock. The prose
around the markers is kept; every figure between them comes from the files.

    python3 bench/claims_report.py [--out docs/results/claims] [--doc docs/results.md] [--k 8]
"""
import argparse
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from claims_experiment import OBJECTIVES, base_check, best_lr, read_json  # noqa: E402
from staleness_experiment import fmt_mean  # noqa: E402

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
STABLE = ("grpo", "spo", "asympo")  # the claim-1 objectives that should not collapse
TOLERANCE = 0.02                    # claims 2 and 3: two points of mean@k
# The verdict line's lead: at the shared lr (grpo's best at lag 0), or each
# objective at its own best lr (the second table).
VERDICT = {False: "Verdict", True: "Verdict at the own lrs"}


def load(folder):
    return [read_json(path) for path in sorted(glob.glob(os.path.join(folder, "*.json")))]


def mean_sd(values, digits=3):
    """staleness_experiment's mean ± sd, also skipping NaN (a run without the measure)."""
    return fmt_mean([v for v in values if v is None or v == v], digits)


def mean(values):
    values = [v for v in values if v is not None and v == v]
    return statistics.mean(values) if values else float("nan")


def cell(runs, objective, lr, lag):
    return sorted((r for r in runs if r["objective"] == objective and r["lr"] == lr and r["lag"] == lag),
                  key=lambda r: r["seed"])


def score(r, k):
    return r["eval"].get("mean@%d" % k, float("nan"))


def collapses(rs):
    hit = [r["collapse_step"] for r in rs if r["collapse_step"] is not None]
    return "%d of %d%s" % (len(hit), len(rs), " (%s)" % ", ".join(map(str, hit)) if hit else "")


def base_section(base):
    s = base["s_g"]
    return ["**The base** (`%s`, %.0f s): supervised training stopped at step %d with held-out greedy "
            "accuracy %.3f (target %.2f); its sampled accuracy is %.3f. Per-response mean token NLL S_g "
            "over %d sampled responses: median %.3f nats (p10 %.3f, p90 %.3f); within a group the "
            "largest 1/S_g is %.2f times the smallest (median; p90 %.2f)." % (
                base["command"], base["seconds"], base["sft"]["steps"], base["sft"]["greedy_acc"],
                base["sft"]["target"], base["sample_accuracy"], base["responses"], s["median"], s["p10"],
                s["p90"], base["inverse_s_ratio"]["median"], base["inverse_s_ratio"]["p90"]),
            "", "Check before RL: %s." % base_check(base)[1], ""]


def sweep_section(sweep, k, objectives, lrs):
    lines = ["**The learning-rate sweep** (lag 0; mean@%d, mean ± sd over seeds; **bold**: the "
             "objective's best, the shared rate is GRPO's):" % k, "",
             "| objective | " + " | ".join("lr %g" % lr for lr in lrs) + " |",
             "| --- |" + " ---: |" * len(lrs)]
    for o in objectives:
        best = best_lr(sweep, o, k)
        row = []
        for lr in lrs:
            rs = cell(sweep, o, lr, 0)
            text = "%s (%d)" % (mean_sd([score(r, k) for r in rs]), len(rs)) if rs else "-"
            row.append("**%s**" % text if lr == best and rs else text)
        lines.append("| `%s` | %s |" % (o, " | ".join(row)))
    return lines + [""]


def grid_table(runs, k, objectives, lags, lr_of):
    lines = ["| objective | lr | lag | seeds | mean@%d | greedy | pass@%d | final reward | peak reward | "
             "collapsed (step) | S_P | S_N | degenerate first → last | order entropy last | behavior KL |" % (k, k),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |"]
    for o in objectives:
        lr = lr_of(o)
        for lag in lags:
            rs = cell(runs, o, lr, lag)
            if not rs:
                continue
            deg = [r["trajectory"]["degenerate_fraction"] for r in rs if "trajectory" in r]
            lines.append("| `%s` | %g | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                o, lr, lag, len(rs), mean_sd([score(r, k) for r in rs]),
                mean_sd([r["eval"].get("greedy_acc") for r in rs]),
                mean_sd([r["eval"].get("pass@%d" % k) for r in rs]),
                mean_sd([r["final_reward20"] for r in rs]), mean_sd([r["peak_reward20"] for r in rs]),
                collapses(rs), mean_sd([r["s_pos"] for r in rs]), mean_sd([r["s_neg"] for r in rs]),
                "%.2f → %.2f" % (mean([d[0] for d in deg]), mean([d[1] for d in deg])) if deg else "-",
                mean_sd([r["order_entropy_last"] for r in rs], 2),
                "-" if lag == 0 else mean_sd([r["behavior_kl"] for r in rs], 4)))
    return lines + [""]


def paired(runs, a, b, lr_a, lr_b, lag, k):
    """Per-seed a - b of mean@k over the seeds both have."""
    sa = {r["seed"]: score(r, k) for r in cell(runs, a, lr_a, lag)}
    sb = {r["seed"]: score(r, k) for r in cell(runs, b, lr_b, lag)}
    return [(s, sa[s] - sb[s]) for s in sorted(set(sa) & set(sb))]


def verdict(holds, complete=True):
    """confirmed / not confirmed / mixed from per-case booleans (None: no
    data); said to be partial while a case lacks runs."""
    known = [h for h in holds if h is not None]
    if not known:
        return "not measured yet"
    said = "confirmed" if all(known) else "not confirmed" if not any(known) else "mixed"
    return said if complete and len(known) == len(holds) else said + " so far (runs still missing)"


def claim1(runs, lr_of, lags, objectives, seeds, own=False):
    """Claim 1 with each objective at lr_of(objective): the shared rate, or
    (own) each objective's best at lag 0."""
    stale = [lag for lag in lags if lag > 0]
    lines = ["**Claim 1%s: `naive` and `gpg` collapse late under staleness, `grpo`, `spo` and `asympo` do "
             "not.** Rule: a run collapses when, after the first half of training, its 20-step mean "
             "reward falls below half its running peak. Collapsed runs at %s:" % (
                 " at each objective's own lr" if own else "", "each objective's own lr" if own else "the shared lr"),
             "", "| objective | lr | " + " | ".join("lag %d" % lag for lag in lags) + " |",
             "| --- | ---: |" + " --- |" * len(lags)]
    for o in objectives:
        lines.append("| `%s` | %g | %s |" % (o, lr_of(o), " | ".join(
            collapses(cell(runs, o, lr_of(o), lag)) or "-" for lag in lags)))
    unstable = [r for o in ("naive", "gpg") for lag in stale for r in cell(runs, o, lr_of(o), lag)]
    stable = [r for o in STABLE for lag in lags for r in cell(runs, o, lr_of(o), lag)]
    hit_u = sum(r["collapse_step"] is not None for r in unstable)
    hit_s = sum(r["collapse_step"] is not None for r in stable)
    holds = [hit_u * 2 >= len(unstable) if unstable else None, hit_s == 0 if stable else None]
    complete = all(len(cell(runs, o, lr_of(o), lag)) >= seeds for o in ("naive", "gpg") + STABLE
                   for lag in lags)
    said = verdict(holds, complete) if unstable else "not measured yet"
    lines += ["", "%s: **%s**: %d of %d stale `naive`/`gpg` runs collapsed (the claim needs at least half), "
              "%d of %d `grpo`/`spo`/`asympo` runs did (it needs none)." % (
                  VERDICT[own], said, hit_u, len(unstable), hit_s, len(stable)), ""]
    return lines


def compare(runs, a, b, lr_a, lr_b, lags, k, seeds, title, rule):
    lines = [title, "", "| lag | %s mean@%d | %s mean@%d | difference (mean ± sd) | per seed |" % (a, k, b, k),
             "| ---: | ---: | ---: | ---: | --- |"]
    holds, complete = [], True
    for lag in lags:
        pairs = paired(runs, a, b, lr_a, lr_b, lag, k)
        complete = complete and len(pairs) >= seeds
        if not pairs:
            holds.append(None)
            lines.append("| %d | - | - | - | not run yet |" % lag)
            continue
        diffs = [d for _, d in pairs]
        holds.append(rule(mean(diffs)))
        lines.append("| %d | %s | %s | %s | %s |" % (
            lag, mean_sd([score(r, k) for r in cell(runs, a, lr_a, lag)]),
            mean_sd([score(r, k) for r in cell(runs, b, lr_b, lag)]), mean_sd(diffs),
            ", ".join("%+.3f (seed %d)" % (d, s) for s, d in pairs)))
    return lines, holds, complete


def claims_2_3(runs, lr_of, lags, k, seeds, own=False):
    stale = [lag for lag in lags if lag > 0]
    at = (" at each objective's own lr (`asympo` %g, `grpo` %g, `spo` %g)" % (
        lr_of("asympo"), lr_of("grpo"), lr_of("spo"))) if own else ""
    lines, holds, complete = compare(
        runs, "asympo", "grpo", lr_of("asympo"), lr_of("grpo"), stale, k, seeds,
        "**Claim 2%s: `asympo` within %d points of `grpo`'s mean@%d at lags %s.** Rule: the mean over "
        "seeds of the per-seed difference is at least -%.2f (being better holds too)." % (
            at, round(100 * TOLERANCE), k, " and ".join(map(str, stale)), TOLERANCE),
        lambda d: d >= -TOLERANCE)
    lines += ["", "%s: **%s**." % (VERDICT[own], verdict(holds, complete)), ""]
    more, holds, complete = compare(
        runs, "asympo", "spo", lr_of("asympo"), lr_of("spo"), lags, k, seeds,
        "**Claim 3%s: `asympo` against `spo`.** Rule: `asympo` at least `spo`'s mean@%d minus %.2f at "
        "every lag." % (at, k, TOLERANCE), lambda d: d >= -TOLERANCE)
    lines += more + ["", "%s: **%s**." % (VERDICT[own], verdict(holds, complete)), ""]
    return lines


def kl_section(runs, lr, lags, objectives):
    stale = [lag for lag in lags if lag > 0]
    lines = ["**Behavior-to-current drift**: mean token KL(sampling weights ‖ training weights) over the "
             "second half of each run, at the shared lr (nats per token, mean ± sd over seeds):", "",
             "| objective | " + " | ".join("lag %d" % lag for lag in stale) + " |",
             "| --- |" + " ---: |" * len(stale)]
    for o in objectives:
        lines.append("| `%s` | %s |" % (o, " | ".join(
            mean_sd([r["behavior_kl"] for r in cell(runs, o, lr, lag)], 4) for lag in stale)))
    return lines + [""]


def mechanism_section(sweep, copy, k, lrs):
    lines = ["**The mechanism on both tasks** (lag 0; mean over seeds). Degenerate: the fraction of groups "
             "whose rewards are all equal (no signal); first 20 steps → last 50, and over steps 331-350. "
             "NLL and S_P: the last 50 steps. On copy, the 20-step training accuracy when the mean token "
             "NLL first fell below 1.0 (add starts below it); on add, the entropy of the operand orders within a "
             "group, first 20 steps → last 20:", "",
             "| task | objective | lr | seeds | greedy | mean@%d | degenerate first → last | degenerate 331-350 | "
             "mean NLL | S_P | accuracy at NLL < 1 | order entropy first → last |" % k,
             "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]

    def row(task, o, lr, rs):
        t = [r["trajectory"] for r in rs if "trajectory" in r]
        if not t:
            return
        below = [x["nll_below_1"]["accuracy20"] for x in t if x.get("nll_below_1")]
        entropy = [(r["order_entropy_first"], r["order_entropy_last"]) for r in rs if "order_entropy_first" in r]
        entropy = [e for e in entropy if e[0] == e[0]]
        lines.append("| %s | `%s` | %s | %d | %s | %s | %.2f → %.2f | %s | %.3f | %.3f | %s | %s |" % (
            task, o, lr, len(rs), mean_sd([r["eval"].get("greedy_acc") for r in rs], 2),
            mean_sd([score(r, k) for r in rs], 2), mean([x["degenerate_fraction"][0] for x in t]),
            mean([x["degenerate_fraction"][1] for x in t]),
            mean_sd([x.get("degenerate_350") for x in t], 2), mean([x["mean_nll"][1] for x in t]),
            mean([x["s_pos"][1] for x in t]), mean_sd(below, 2),
            "%.2f → %.2f" % (mean([e[0] for e in entropy]), mean([e[1] for e in entropy])) if entropy else "-"))
    for o in ("grpo", "spo", "asympo"):
        for lr in lrs:
            row("add", o, "%g" % lr, cell(sweep, o, lr, 0))
    for o in OBJECTIVES:
        row("copy", o, "3e-4", sorted((r for r in copy if r["objective"] == o), key=lambda r: r["seed"]))
    return lines + [""]


def daemons_section(daemons, runs, lr, k):
    if not daemons:
        return ["**Through the daemons**: not run yet (`--phase daemons`).", ""]
    lag = max(r["lag"] for r in runs) if runs else 0
    lines = ["**Through the daemons** (`deploy/local_run.py`: a learner, two rollout daemons, the base, "
             "queue of %d groups; seed %d; commands in `docs/results/claims/daemons/*.json`) beside the "
             "grid at lag %d (mean over its seeds):" % (daemons[0]["queue"], daemons[0]["seed"], lag), "",
             "| objective | staleness (steps, mean) | policy lag mean / p90 | final reward | peak reward | "
             "collapse step | greedy | mean@%d | grid lag %d: greedy / mean@%d / collapsed |" % (k, lag, k),
             "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for d in daemons:
        rs = cell(runs, d["objective"], lr, lag)
        pl = d.get("policy_lag")
        lines.append("| `%s` | %.1f | %s | %.3f | %.3f | %s | %.3f | %.3f | %s |" % (
            d["objective"], d["staleness_mean"], "%.1f / %g" % (pl["mean"], pl["p90"]) if pl else "-",
            d["final_reward20"], d["peak_reward20"], d["collapse_step"] or "none", d["eval"]["greedy_acc"],
            d["eval"].get("mean@%d" % k, float("nan")),
            "%.3f / %.3f / %s" % (mean([r["eval"].get("greedy_acc") for r in rs]),
                                  mean([score(r, k) for r in rs]), collapses(rs)) if rs else "-"))
    return lines + [""]


def wall_section(groups):
    lines = ["**Wall clock** (2-core machine, two runs at a time, so each run shared the cores):", "",
             "| runs | count | median per run (s) | in all (min) |", "| --- | ---: | ---: | ---: |"]
    total = 0.0
    for name, rs in groups:
        secs = [r["seconds"] for r in rs if r.get("seconds") == r.get("seconds")]
        if secs:
            total += sum(secs)
            lines.append("| %s | %d | %.0f | %.0f |" % (name, len(secs), statistics.median(secs), sum(secs) / 60))
    return lines + ["| all | %d | | %.0f |" % (sum(len(rs) for _, rs in groups), total / 60), ""]


def render(out, k, lags=(0, 4, 16), seeds=3):
    base = load(os.path.join(out, "base"))
    sweep, grid = load(os.path.join(out, "sweep")), load(os.path.join(out, "grid"))
    daemons, copy = load(os.path.join(out, "daemons")), load(os.path.join(out, "copy"))
    objectives = [o for o in OBJECTIVES if any(r["objective"] == o for r in sweep + grid)]
    lrs = sorted({r["lr"] for r in sweep})
    runs = sweep + grid
    lags = sorted(set(lags) | {r["lag"] for r in runs})
    shared = best_lr(sweep, "grpo", k)
    own = {o: best_lr(sweep, o, k) for o in objectives}
    lines = [BEGIN, "Generated by `python3 bench/claims_report.py` from `docs/results/claims/` (%d sweep, %d grid, "
             "%d daemon and %d copy result files); each file names the command that made it." % (
                 len(sweep), len(grid), len(daemons), len(copy)), ""]
    lines += base_section(base[0]) if base else []
    lines += sweep_section(sweep, k, objectives, lrs)
    lines += ["**The grid at the shared lr %g** (GRPO's best at lag 0; mean ± sd over seeds; final and peak: "
              "20-step mean training reward; S_P, S_N: whole run; behavior KL: second half):" % shared, ""]
    lines += grid_table(runs, k, objectives, lags, lambda o: shared)
    lines += claim1(runs, lambda o: shared, lags, objectives, seeds)
    lines += claims_2_3(runs, lambda o: shared, lags, k, seeds)
    lines += kl_section(runs, shared, lags, objectives)
    differs = [o for o in objectives if own[o] is not None and own[o] != shared]
    lines += ["**Each objective at its own best lr** (where it differs from the shared one: %s):" % (
        ", ".join("`%s` %g" % (o, own[o]) for o in differs) or "none"), ""]
    if differs:
        lines += grid_table(runs, k, differs, lags, lambda o: own[o])
        lines += claim1(runs, lambda o: own[o], lags, objectives, seeds, own=True)
        lines += claims_2_3(runs, lambda o: own[o], lags, k, seeds, own=True)
    lines += mechanism_section(sweep, copy, k, lrs) + daemons_section(daemons, runs, shared, k)
    lines += wall_section([("sweep (lag 0)", sweep)] + [("grid lag %d" % lag, [r for r in grid if r["lag"] == lag])
                                                         for lag in lags if lag > 0] +
                          [("daemons", daemons), ("copy", copy), ("base", base)])
    return "\n".join(lines + [END])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/claims", help="claims_experiment.py's --out")
    ap.add_argument("--doc", default="docs/results.md", help="the page whose claims markers are replaced")
    ap.add_argument("--k", type=int, default=8, help="the k of mean@k (the runs' --eval_prompts_k)")
    ap.add_argument("--lags", default="0,4,16", help="the lags the claims are checked at (the grid's)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds a cell needs before its verdict is final")
    args = ap.parse_args()
    text = render(args.out, args.k, [int(x) for x in args.lags.split(",") if x], args.seeds)
    with open(args.doc) as f:
        page = f.read()
    if BEGIN not in page or END not in page:
        sys.exit("claims_report: %s has no %s ... %s markers" % (args.doc, BEGIN, END))
    head, rest = page.split(BEGIN, 1)
    page = head + text + rest.split(END, 1)[1]
    with open(args.doc + ".tmp", "w") as f:
        f.write(page)
    os.replace(args.doc + ".tmp", args.doc)
    print("wrote %s" % args.doc)


if __name__ == "__main__":
    main()
