"""Repeated runs: each run's figures kept, then summarised per figure.

Why repeat: on a shared machine one run's figures carry the host's noise (a
neighbour's job, a slow start), and a single run cannot say how large that is.
``--repeat N`` runs the targets interleaved, and in a balanced order (A B C,
C B A, A B C, ...: :func:`run_order`), so a slow period hits every target alike
instead of one whole target, and no target always runs first.

What is summarised: every run's figures come from that run's own samples
(its percentiles are nearest-rank over its merged samples, as in a single
run). Percentiles are never averaged or merged across runs: the summary of
"get p99" is taken over the per-run p99s.

**The median** of the runs' values is their nearest-rank 50th percentile
(:func:`djcachebench.bench.stats.percentile`): an observed run's figure, the
lower middle one for an even count.

**The interval** is the distribution-free confidence interval for the median
from order statistics: with ``n`` runs sorted, ``[x(l), x(n+1-l)]`` covers the
true median with probability ``1 - 2 P(B <= l-1)``, ``B ~ Binomial(n, 1/2)``,
whatever the figures' distribution. ``l`` is the largest rank that keeps the
coverage at or above 95%. Why this and not a t-interval or a bootstrap: one
disturbed run (the common failure on a shared host) is an outlier that a
t-interval's standard deviation inflates and whose normality assumption it
breaks, and a bootstrap of a median over a handful of runs only resamples the
same few values while claiming 95%. The price is honesty about small counts:
fewer than 6 runs cannot give 95% without assumptions, so the interval is
then the runs' range with its true coverage (3 runs: 75%, 5 runs: 93.75%),
and the report says so. ``--repeat 6`` or more gives a 95% interval.

**The flag.** A figure is *unstable* when its interval reaches more than
:data:`TOLERANCE` (10%) of the median away from it: its runs disagree by more
than that, so a difference between backends smaller than the interval is not
one to read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from djcachebench.bench.stats import percentile

T = TypeVar("T")

CONFIDENCE = 0.95
TOLERANCE = 0.10
#: Runs needed for a 95% distribution-free interval of the median.
RUNS_FOR_95 = 6


@dataclass(frozen=True)
class Interval:
    """The median of per-run values and its distribution-free confidence interval."""

    median: float
    low: float
    high: float
    n: int
    #: The interval's exact coverage (0 for one run: no interval).
    confidence: float

    @property
    def unstable(self) -> bool:
        """The interval reaches more than TOLERANCE of the median away from it."""
        if self.n < 2 or self.median == 0:
            return False
        reach = max(self.median - self.low, self.high - self.median)
        return reach > TOLERANCE * abs(self.median)

    def to_dict(self) -> dict[str, float | int | bool]:
        return {
            "median": self.median,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "confidence": round(self.confidence, 6),
            "unstable": self.unstable,
        }


def binomial_tail(k: int, n: int) -> float:
    """P(B <= k) for B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Median and order-statistic confidence interval of ``values`` (one per run)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no runs to summarise")
    median = percentile(ordered, 50)
    if n == 1:
        return Interval(median, median, median, 1, 0.0)
    rank = 1  # 1-based: [x(rank), x(n + 1 - rank)]
    while rank < n // 2 and 1 - 2 * binomial_tail(rank, n) >= confidence:
        rank += 1
    coverage = 1 - 2 * binomial_tail(rank - 1, n)
    return Interval(median, ordered[rank - 1], ordered[n - rank], n, coverage)


def coverage_note(n: int) -> str:
    """How to read the intervals of ``n`` runs, for the reports."""
    if n < 2:
        return "one run: no interval"
    coverage = median_interval(range(n)).confidence
    if coverage >= CONFIDENCE:
        return f"{n} runs: {coverage:.1%} distribution-free interval of the median"
    return (
        f"{n} runs: the interval is the runs' range, a {coverage:.1%} interval of the median "
        f"(a 95% one needs {RUNS_FOR_95} runs or more)"
    )


def run_order(items: Sequence[T], index: int) -> list[T]:
    """The order of round ``index`` (0-based) of a repeated run: as given in even
    rounds, reversed in odd ones (A B C, C B A, A B C, ...).

    Why not A B C every round: on this kind of host the position in a round
    biases a run by itself. Measured here, the tree run first of a pair was
    the faster in five of six pairs (docs/benchmarks.md, "The reference
    workload under 8 processes, after the floors"). Over an even number of
    rounds every target then holds each position equally often, and a drift
    that grows steadily through the run (a file cache filling, a neighbour
    starting) lands on every target alike.
    """
    return list(items) if index % 2 == 0 else list(reversed(items))
