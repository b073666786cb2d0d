"""The statistics that decide the paper's claims (docs/method.md, "Deciding
the paper's claims"), in plain Python (no scipy on the machines this runs
on): paired intervals against a tolerance, the variance ratio's interval,
the exact interval of a fraction, and collapse over a whole run.

The quantiles come from the regularized incomplete beta function I_x(a, b)
(its continued fraction, evaluated by the modified Lentz method), inverted
by bisection: Student's t, Fisher's F and the beta distribution all reduce
to it."""
import decimal
import math
import statistics


def _beta_cf(a, b, x):
    """The continued fraction of I_x(a, b), for x < (a + 1) / (a + b + 2)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), a, b > 0."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def _invert(cdf, p, lo, hi):
    """x in [lo, hi] with cdf(x) = p (cdf increasing), by bisection."""
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t_quantile(p, df):
    """Student's t quantile, 0.5 < p < 1."""
    def cdf(t):
        return 1.0 - 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return _invert(cdf, p, 0.0, 1e6)


def f_quantile(p, d1, d2):
    """Fisher's F quantile, 0 < p < 1."""
    return _invert(lambda f: betainc(d1 / 2.0, d2 / 2.0, d1 * f / (d1 * f + d2)), p, 0.0, 1e8)


def beta_quantile(p, a, b):
    return _invert(lambda x: betainc(a, b, x), p, 0.0, 1.0)


def paired_interval(a, b, level=0.95):
    """Per-seed differences a - b (dicts seed -> value; the seeds both
    have): (mean, low, high, n). low and high are None for fewer than 2."""
    d = [a[s] - b[s] for s in sorted(set(a) & set(b))]
    if not d:
        return None, None, None, 0
    m = statistics.mean(d)
    if len(d) < 2:
        return m, None, None, len(d)
    half = t_quantile(0.5 + level / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return m, m - half, m + half, len(d)


def welch_interval(a, b, level=0.95):
    """mean(a) - mean(b) of two independent samples and its Welch interval:
    (difference, low, high); low and high are None for fewer than 2 values
    on a side or no spread at all."""
    if not a or not b:
        return None, None, None
    m = statistics.mean(a) - statistics.mean(b)
    if len(a) < 2 or len(b) < 2:
        return m, None, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return m, None, None
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(va + vb)
    return m, m - half, m + half


def judge(low, high, tolerance):
    """A claim that the true difference is at least -tolerance: confirmed
    when the interval lies at or above it, refuted when below, inconclusive
    when it straddles it (or is unknown)."""
    if low is None or high is None:
        return "inconclusive"
    if low >= -tolerance:
        return "confirmed"
    if high < -tolerance:
        return "refuted"
    return "inconclusive"


def combine(verdicts):
    """A claim over several lags: confirmed when every lag is, refuted when
    any lag is, inconclusive otherwise."""
    if verdicts and all(v == "confirmed" for v in verdicts):
        return "confirmed"
    if any(v == "refuted" for v in verdicts):
        return "refuted"
    return "inconclusive"


def variance_ratio_interval(a, b, level=0.95):
    """var(a) / var(b) and its interval from F(n_a - 1, n_b - 1)."""
    if len(a) < 2 or len(b) < 2:
        return None, None, None
    va, vb = statistics.variance(a), statistics.variance(b)
    if vb == 0:
        return None, None, None
    r, da, db = va / vb, len(a) - 1, len(b) - 1
    q = (1 - level) / 2
    return r, r / f_quantile(1 - q, da, db), r / f_quantile(q, da, db)


def fraction_interval(x, n, level=0.95):
    """Clopper-Pearson's exact interval of x successes in n."""
    q = (1 - level) / 2
    low = 0.0 if x == 0 else beta_quantile(q, x, n - x + 1)
    high = 1.0 if x == n else beta_quantile(1 - q, x + 1, n - x)
    return low, high


def decimal_text(x, digits):
    """x with `digits` decimals, a half rounded up (away from zero) on the
    decimal value rather than on the binary one, so that a mean the files
    put exactly on a half (0.2055) prints the same however it was summed."""
    if x is None or x != x:
        return "nan"
    exact = decimal.Decimal(repr(round(x, 9)))
    return str(exact.quantize(decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP))


def window_means(rewards, window=20):
    """The `window`-step mean reward over whole windows: item i is the mean
    of steps i + 1 to i + window (rewards[0] is step 1), so it belongs to
    step i + window."""
    return [statistics.mean(rewards[i - window + 1:i + 1]) for i in range(window - 1, len(rewards))]


def collapse(rewards, base, window=20):
    """A run's collapse, judged over the whole run (rewards[0] is step 1,
    as in the rows' step column): its `window`-step mean reward reaches a
    peak above `base`, then falls below half of that peak and stays there
    for at least `window` steps. Returns ("collapsed", the step of the
    fall), ("did not learn", None) when the mean never rose above base, or
    ("held", None)."""
    return collapse_of(window_means(rewards, window), base, window)


def collapse_of(means, base, window):
    """collapse, on the run's window_means."""
    if not means or max(means) <= base:
        return "did not learn", None
    peak = -math.inf
    for i, m in enumerate(means):
        peak = max(peak, m)
        if peak > base and m < peak / 2:
            after = means[i:i + window]
            if len(after) == window and all(v < peak / 2 for v in after):
                return "collapsed", i + window
    return "held", None


def fall_shape(rewards, base, window=20):
    """Where a collapsed run fell from: (the peak of its `window`-step mean
    reward before the fall, that peak's step, the first step after the fall
    at which the mean rose above that peak again or None); None when the
    run did not collapse."""
    means = window_means(rewards, window)
    verdict, fall = collapse_of(means, base, window)
    if verdict != "collapsed":
        return None
    before = means[:fall - window + 1]  # means[i] is step i + window
    peak = max(before)
    again = next((i + window for i in range(fall - window + 1, len(means)) if means[i] > peak), None)
    return peak, before.index(peak) + window, again
