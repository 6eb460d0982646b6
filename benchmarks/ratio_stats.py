"""A benchmark ratio with its uncertainty: per-repetition ratios, their median and a distribution-free interval
for that median (issue 47, item 3).

Arms that take turns within a repetition share that repetition's state of the machine (clock, temperature, other
load), so the ratio of one arm's time to the other's in the same repetition cancels most of what moves between
repetitions; the median of those ratios is the figure, and its interval says whether two figures differ.

The interval is the sign-test (order-statistic) interval for a median: with n ratios sorted, x_(k) <= median <=
x_(n-k+1) holds with probability 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2), for any continuous distribution of
the ratios (each ratio falls below the true median with probability 1/2, independently). k is the largest rank
that keeps that probability at least the confidence asked for, so the interval's coverage is exact and at least
the one asked for (printed as achieved). For normally scattered ratios its half-width is about
1.96 x 1.25 x sigma / sqrt(n): with a single ratio's sigma of 5 %, 30 repetitions give about ±2.2 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Each repetition's ratio, ``numerators[i] / denominators[i]``.

    Args:
        numerators: one arm's time per repetition.
        denominators: the reference arm's time in the same repetitions (same length, all positive).
    """
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} times against {len(denominators)}: pair each repetition with its own")
    if any(d <= 0 for d in denominators):
        raise ValueError("a reference time is not positive: a repetition was not timed")
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


def binomial_half_cdf(n: int, j: int) -> float:
    """P(B <= j) for B ~ Binomial(n, 1/2)."""
    if j < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(j, n) + 1)) / 2**n


def median_rank(n: int, confidence: float = 0.95) -> tuple[int, float]:
    """The rank k (1-based) whose order statistics x_(k), x_(n-k+1) bound the median with coverage >= confidence.

    Returns:
        (k, achieved coverage 1 - 2 P(B <= k - 1)).

    Raises:
        ValueError: when n is too small for any interval at this confidence (the full range [min, max] covers
            with 1 - 2^(1-n) only).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2
    if n < 1 or binomial_half_cdf(n, 0) > tail:
        least = next(m for m in range(1, 64) if binomial_half_cdf(m, 0) <= tail)
        raise ValueError(
            f"{n} repetitions give no {confidence:.0%} interval for the median: use at least {least} (--reps)"
        )
    k = 1
    while k + 1 <= (n + 1) // 2 and binomial_half_cdf(n, k) <= tail:
        k += 1
    return k, 1 - 2 * binomial_half_cdf(n, k - 1)


@dataclass(frozen=True)
class RatioSummary:
    """The median of per-repetition ratios with its interval and spread.

    Attributes:
        median: the median ratio.
        low, high: the interval for the median (order statistics k and n - k + 1).
        confidence: the interval's exact coverage (at least the one asked for).
        n: repetitions.
        minimum, maximum: the spread of the single ratios.
    """

    median: float
    low: float
    high: float
    confidence: float
    n: int
    minimum: float
    maximum: float

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the median (0.02 is ±2 %)."""
        return (self.high - self.low) / 2 / self.median

    def text(self) -> str:
        """One line: ``1.004x [0.981, 1.032] (95.7 % interval of the median, ±2.5 %; 30 repetitions, each
        0.950-1.100)``."""
        return (
            f"{self.median:.3f}x [{self.low:.3f}, {self.high:.3f}] ({100 * self.confidence:.1f} % interval of the "
            f"median, ±{100 * self.half_width:.1f} %; {self.n} repetitions, each {self.minimum:.3f}-{self.maximum:.3f})"
        )


def median(values: Sequence[float]) -> float:
    """The sample median (the mean of the two middle values for an even count)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summarize(ratios: Sequence[float], confidence: float = 0.95) -> RatioSummary:
    """The median of ``ratios`` with its sign-test interval (:func:`median_rank`) and their spread."""
    ordered = sorted(ratios)
    k, achieved = median_rank(len(ordered), confidence)
    return RatioSummary(
        median=median(ordered),
        low=ordered[k - 1],
        high=ordered[len(ordered) - k],
        confidence=achieved,
        n=len(ordered),
        minimum=ordered[0],
        maximum=ordered[-1],
    )
