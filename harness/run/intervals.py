"""95 % intervals for the means of lctx's tables.

Two kinds, chosen per cell by its values, and named in the tables' ``interval`` column:

- ``wilson``: every value of the cell is 0 or 1 (exact match, a passkey, a NIAH string_match_all over one
  needle, accuracy on a question): the Wilson score interval of k successes in n trials (Wilson 1927, "Probable
  inference, the law of succession, and statistical inference", JASA 22; the form of Brown, Cai and DasGupta
  2001, "Interval estimation for a binomial proportion", Statistical Science 16, eq. 4). Unlike mean ± 1.96 se
  it is never wider than [0, 1] and not empty at 0 / n or n / n: one exact sample out of one is [0.21, 1].
- ``t``: any cell with another value (perplexity, a digit_acc of 0.8, a sequence-match ratio): Student's t interval
  mean ± t(0.975, n - 1) · stderr, stderr = sample std / sqrt(n); none (NaN) for n < 2, where a spread cannot be
  estimated.

The kind follows the cell's values: a cell whose values are all 0 or 1 is a proportion (a digit_acc of 1.0 for
every sample gets Wilson's interval, another cell of the same metric t's), for a metric that can be one
(:func:`lctx.metrics.may_be_proportion`: registered with the range [0, 1], or not registered); a ppl_ratio of
exactly 1.0 or an n_docs of 1 is not a proportion, and gets t's. A t interval is
clipped to the metric's registered range (:attr:`lctx.metrics.Metric.bounds`: a mean near 0 of a [0, 1] score
would otherwise show a negative low end); a metric without one (ppl, a custom task's) is not clipped.

Imports scipy (a dependency: RULER's fwe uses it too) only for the t quantile.
"""

from __future__ import annotations

import math

#: the two-sided coverage of every interval lctx reports
LEVEL = 0.95
Z = 1.959963984540054  # the standard normal's 0.975 quantile (scipy.stats.norm.ppf(0.975))


def wilson(k: float, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson score interval of ``k`` successes in ``n`` trials: (low, high), proportions in [0, 1].

    centre = (k + z²/2) / (n + z²), half-width = z / (n + z²) · sqrt(k (n - k) / n + z²/4) (Brown, Cai and
    DasGupta 2001, eq. 4). Hand check: k = 4, n = 5 gives [0.376, 0.964]; k = n = 1 gives [0.207, 1].

    Raises:
        ValueError: n < 1, or k outside [0, n].
    """
    if n < 1:
        raise ValueError(f"wilson: n = {n}; need at least one trial")
    if not 0 <= k <= n:
        raise ValueError(f"wilson: k = {k} outside [0, n = {n}]")
    z2 = z * z
    centre = (k + z2 / 2) / (n + z2)
    half = z / (n + z2) * math.sqrt(k * (n - k) / n + z2 / 4)
    # at k = 0 (k = n) the low (high) end is 0 (1) exactly; the formula leaves ~1e-17 of rounding there
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def t_interval(mean: float, stderr: float, n: int) -> tuple[float, float]:
    """Student's t interval mean ± t(0.975, n - 1) · stderr; (NaN, NaN) for n < 2 or a non-finite stderr.

    Hand check: mean 10, stderr 1, n = 5 gives t(0.975, 4) = 2.776, so [7.224, 12.776].
    """
    if n < 2 or stderr is None or not math.isfinite(stderr):
        return math.nan, math.nan
    from scipy.stats import t  # lazy: ~0.3 s; only when a continuous cell has n >= 2

    h = float(t.ppf(0.5 + LEVEL / 2, n - 1)) * stderr
    return mean - h, mean + h


def is_binary(values) -> bool:
    """True when every value is 0 or 1 (the cell is a proportion, so its interval is Wilson's)."""
    vals = [float(v) for v in values]
    return bool(vals) and all(v in (0.0, 1.0) for v in vals)


def interval(mean: float, stderr: float, n: int, kind: str, bounds: tuple | None = None) -> tuple[float, float]:
    """The 95 % interval of a cell of ``kind`` ``wilson`` (k = round(mean · n)) or ``t``; (NaN, NaN) for an empty
    cell or another kind. ``bounds``: the metric's range (:func:`lctx.metrics.bounds_of`, e.g. (0, 1)): a t
    interval is clipped to it, so a [0, 1] score with a mean near 0 does not show a negative low end (the ends
    inside the range are the t interval's; Wilson's never leave [0, 1]).

    Raises:
        ValueError: as :func:`wilson`.
    """
    if not n or n < 1 or mean is None or not math.isfinite(mean):
        return math.nan, math.nan
    if kind == "wilson":
        return wilson(round(mean * n), int(n))
    if kind == "t":
        lo, hi = t_interval(mean, stderr, int(n))
        if bounds is not None and math.isfinite(lo):
            lo, hi = max(lo, float(bounds[0])), min(hi, float(bounds[1]))
        return lo, hi
    return math.nan, math.nan


def fmt_interval(lo: float, hi: float, digits: int = 2) -> str:
    """``[lo, hi]`` with ``digits`` decimals, or empty when the interval is undefined (n < 2 for a t interval)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"
