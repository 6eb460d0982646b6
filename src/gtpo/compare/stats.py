"""Small-sample statistics for comparing runs over seeds: means, 95% t-intervals, paired differences.

With 3-5 seeds per arm, a normal interval (mean ± 1.96·s/√n) is far too narrow; the Student t interval
is the standard one for a mean of n independent runs:

    mean ± t_{0.975, n-1} · s / √n,   s² = Σ (x_i - mean)² / (n - 1)

A paired difference compares two arms run with the same seeds (same seed = same prompt order and the same
initial LoRA weights), so the seed-to-seed variation both arms share cancels: d_i = a_i - b_i and the
interval is the t-interval of the d_i. "No detectable difference" means that interval covers 0.

Pure functions, no numpy/scipy: the t quantiles are tabulated (two-sided 95%, from any statistics table)
so that the numbers can be checked by hand.

>>> mean_interval([1.0, 2.0, 3.0]).format()  # 2 ± 4.303 · 1 / √3
'2.00 [-0.48, 4.48]'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gtpo.errors import InvalidInput

# t_{0.975, df}: the two-sided 95% Student t quantile for df = 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.960  # the normal quantile, the limit for df -> infinity


def t_quantile_975(df: int) -> float:
    """Two-sided 95% Student t quantile for ``df`` degrees of freedom (tabulated to df = 30, then
    interpolated in 1/df towards the normal 1.960, which is within 0.001 of the exact value)."""
    if df < 1:
        raise InvalidInput(f"a t-interval needs at least 1 degree of freedom (2 values), got df={df}")
    if df <= len(_T975):
        return _T975[df - 1]
    last = len(_T975)
    return _Z975 + (_T975[-1] - _Z975) * last / df


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% interval over ``n`` values; ``low``/``high`` are None when n < 2."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def covers_zero(self) -> bool | None:
        """Whether the interval contains 0 (None when there is no interval, n < 2)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= 0.0 <= self.high

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}

    def format(self, digits: int = 2) -> str:
        """``'12.3 [10.1, 14.5]'``; ``'12.3 (n=1)'`` without an interval."""
        if self.low is None:
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def mean(values: list[float]) -> float:
    if not values:
        raise InvalidInput("the mean of no values is undefined")
    return sum(values) / len(values)


def sample_std(values: list[float]) -> float:
    """Standard deviation with Bessel's correction (divisor n - 1)."""
    if len(values) < 2:
        raise InvalidInput(f"a sample standard deviation needs at least 2 values, got {len(values)}")
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def mean_interval(values: list[float]) -> Interval:
    """Mean and 95% t-interval of ``values`` (independent runs, e.g. one number per seed)."""
    values = [float(v) for v in values]
    m = mean(values)
    n = len(values)
    if n < 2:
        return Interval(m, None, None, n)
    half = t_quantile_975(n - 1) * sample_std(values) / math.sqrt(n)
    return Interval(m, m - half, m + half, n)


def paired_difference(a: dict, b: dict) -> Interval | None:
    """Mean and 95% t-interval of a[s] - b[s] over the keys (seeds) both mappings have; None if none."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return mean_interval([a[s] - b[s] for s in common])


# The fewest equal-signed differences for which the exact two-sided sign test rejects "no difference" at 5%:
# P = 2 * 0.5**n < 0.05 needs n >= 6.
SIGN_TEST_MIN_N = 6


def verdict(diff: Interval | None, name_a: str, name_b: str) -> str:
    """A sentence-sized reading of a paired difference a - b.

    When every seed gave the same nonzero difference (s = 0, which discrete metrics such as a 10-step accuracy do
    at a few seeds: one more correct completion of 80 in each), the t-interval has zero width and would call any
    n >= 2 a difference. The spread was then too coarse to estimate, so the reading falls back to the exact sign
    test, which needs no spread: n equal-signed differences are a difference only when 2 * 0.5**n < 0.05."""
    if diff is None:
        return "no common seeds"
    if diff.covers_zero is None:
        return f"one seed only (n={diff.n}): no interval"
    if diff.covers_zero:
        return "no detectable difference"
    no_spread = diff.high - diff.low <= 1e-9 * max(1.0, abs(diff.mean))  # s = 0 up to rounding of a - b
    if no_spread and diff.n < SIGN_TEST_MIN_N:
        return f"all {diff.n} differences equal (s = 0): too few seeds to read (a sign test needs {SIGN_TEST_MIN_N})"
    return f"{name_a} higher" if diff.mean > 0 else f"{name_b} higher"


def band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Pointwise (mean, low, high) over equally long curves (one per seed): the 95% t-band.

    With one curve the band is the curve itself."""
    if not curves:
        raise InvalidInput("a band needs at least one curve")
    length = len(curves[0])
    if any(len(c) != length for c in curves):
        raise InvalidInput("curves of one band must have the same length (align them on common steps first)")
    return column_band([list(column) for column in zip(*curves, strict=True)])


def column_band(columns: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """(mean, low, high) of each column (the values the seeds have at one point; columns may differ in size):
    the 95% t-interval, or the mean itself for a column of one value."""
    means, lows, highs = [], [], []
    for column in columns:
        interval = mean_interval(column)
        means.append(interval.mean)
        lows.append(interval.mean if interval.low is None else interval.low)
        highs.append(interval.mean if interval.high is None else interval.high)
    return means, lows, highs
