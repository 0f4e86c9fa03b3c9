"""
The statistics every runner in docs/ reports a difference with: Welch's t for two groups of runs, the paired t
where the runs share seeds, each with its two-sided p-value and 95% interval, and the verdict the interval
allows. Plain Python (no scipy, no torch), so `--tables` runs anywhere.

    from stats import welch, paired, verdict
    d = welch([2.26, 2.13, 2.28], [1.95, 1.99, 1.98])   # d.diff, d.lo, d.hi, d.p, d.df
    verdict(d, "HRM's lead")                             # what the interval lets one say
"""

import math
from dataclasses import dataclass


def _betacf(a, b, x):
    """The continued fraction of the regularised incomplete beta function (modified Lentz's method)."""
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
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom (df may be fractional, as Welch's is)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q, df):
    """The q-quantile of Student's t (q > 0.5), by bisection on t_two_sided."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) > 2 * (1 - q) else (lo, mid)
    return (lo + hi) / 2


@dataclass
class Diff:
    diff: float      # mean of a minus mean of b (paired: mean of the per-seed differences)
    lo: float        # 95% interval
    hi: float
    p: float         # two-sided p-value of "no difference"
    df: float        # degrees of freedom (Welch's are fractional)
    test: str        # "welch" or "paired"
    n: int           # runs per group (paired: pairs)

    @property
    def degenerate(self):
        """No test: the runs (paired: the per-seed differences) do not vary, or their spread overflowed."""
        return not math.isfinite(self.p)

    def __str__(self):
        if self.degenerate:
            return f"{self.diff:+.3f} (no spread among the {self.n} runs: no interval, no p-value)"
        return f"{self.diff:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}], p = {p_text(self.p)}"


def p_text(p):
    if not math.isfinite(p):
        return "none (no spread)"
    return "<0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _mean_var(xs):
    """Mean and sample variance; 0 where the spread is rounding (under 1e-9 of the values: equal CEs differ in
    float's last digits), inf where it overflows (values near 1e308)."""
    m = math.fsum(xs) / len(xs)
    try:
        v = math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    except OverflowError:
        return m, math.inf
    return m, 0.0 if math.sqrt(v) <= 1e-9 * max(1.0, max(abs(x) for x in xs)) else v


def _result(diff, se, df, test, n):
    """A Diff; with no spread (se 0) or an overflowed one, a degenerate Diff (p, interval nan): the t-test assumes
    runs that vary, and a zero-width interval with p = 0 would claim a certainty the data does not give."""
    if se == 0 or not math.isfinite(se) or not math.isfinite(diff):
        return Diff(diff, math.nan, math.nan, math.nan, df, test, n)
    h = t_quantile(0.975, df) * se
    return Diff(diff, diff - h, diff + h, t_two_sided(diff / se, df), df, test, n)


def welch(a, b):
    """Welch's t-test of mean(a) - mean(b); None with fewer than 2 finite runs on a side (a diverged run's CE
    is inf: it is left out, and the table beside says so)."""
    a, b = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    se = math.sqrt(sa + sb)
    if se == 0 or not math.isfinite(se):
        return _result(ma - mb, se, len(a) + len(b) - 2, "welch", min(len(a), len(b)))
    df = (sa + sb) ** 2 / ((sa ** 2 / (len(a) - 1) if sa else 0) + (sb ** 2 / (len(b) - 1) if sb else 0) or 1e-300)
    return _result(ma - mb, se, df if se else len(a) + len(b) - 2, "welch", min(len(a), len(b)))


def paired(a, b):
    """Paired t-test of a - b where a[i] and b[i] share a seed ({seed: value} dicts); None under 2 pairs."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    if len(seeds) < 2:
        return None
    d = [a[s] - b[s] for s in seeds]
    m, v = _mean_var(d)
    return _result(m, math.sqrt(v / len(d)), len(d) - 1, "paired", len(d))


def compare(a, b):
    """{seed: value} dicts -> the paired test where they share at least 2 seeds, else Welch's; None if neither."""
    return paired(a, b) or welch(list(a.values()), list(b.values()))


def verdict(d, effect=None, alpha=0.05):
    """What the 95% interval lets one say: a sign where it excludes 0; "the data cannot tell" where it spans
    both signs (and, given the size of an effect in question, whether the interval reaches it)."""
    if d is None:
        return "too few runs"
    if d.degenerate:
        return f"no test: no spread among the {d.n} runs (or it overflows)"
    if d.lo > 0 or d.hi < 0:
        return ("a lower" if d.hi < 0 else "a higher") + f" CE (p = {p_text(d.p)})"
    tail = "" if effect is None else (
        f"; an effect of {effect:+.2f} is {'inside' if d.lo <= effect <= d.hi else 'outside'} the interval")
    return f"the data cannot tell (the interval spans both signs){tail}"
