"""Latency statistics: merge the workers' raw samples, then one percentile function.

Why raw samples: percentiles of a multi-process run are only exact on the
union of every sample. Averaging per-worker p99s (as some harnesses do) is
wrong whenever workers differ, which is exactly when it matters. At 8 bytes a
sample, the reference run's 800,000 samples are 6.4 MB: cheap enough to ship
whole from each worker and merge exactly, with no histogram error.

Percentile definition (the ONE in the project): **nearest rank**. For ``n``
sorted samples and ``q`` in (0, 100], the value is the sample of 1-based rank
``ceil(q / 100 * n)``. It always returns an observed latency (no invented
values between two samples), ``q = 100`` is the maximum, and it is what
HdrHistogram and memtier report. The rank is computed with exact fractions:
in floats ``99.9 / 100 * 1000`` is ``999.0000000000001``, whose ceiling would
wrongly be 1000 (the maximum) instead of 999. The same function gives the
median of repeated runs' figures (:mod:`djcachebench.bench.summary`), so
every figure the harness reports is one that was observed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, TypeVar

#: The percentiles every action reports (p99.99 for the percentile-distribution chart).
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50),
    ("p90", 90),
    ("p99", 99),
    ("p99.9", 99.9),
    ("p99.99", 99.99),
)

T = TypeVar("T")


def percentile(sorted_samples: Sequence[T], q: float) -> T:
    """Nearest-rank percentile ``q`` (0 < q <= 100) of ascending ``sorted_samples``.

    Returns one of the samples. Raises ValueError on an empty sequence or a
    ``q`` outside (0, 100].
    """
    n = len(sorted_samples)
    if n == 0:
        raise ValueError("percentile of no samples")
    if not 0 < q <= 100:
        raise ValueError(f"percentile q must be in (0, 100], got {q}")
    # rank = ceil(q/100 * n), computed exactly: Fraction(str(q)) keeps 99.9 as 999/10.
    exact = Fraction(str(q)) * n / 100
    rank = -(-exact.numerator // exact.denominator)
    return sorted_samples[max(rank, 1) - 1]


#: Samples a percentile needs per unit of tail: p is reported when n >= SUPPORT / (1 - p),
#: i.e. with about ten samples beyond it. Fewer, and the "percentile" is one of the
#: few largest samples (six delete calls: p90, p99 and max are the same call).
SUPPORT = 10


def min_samples(q: float) -> int:
    """The fewest samples for percentile ``q`` to be reported: 20 for p50, 1,000 for p99."""
    if q >= 100:
        return 1
    return math.ceil(SUPPORT / (1 - Fraction(str(q)) / 100))  # exact: p99.9 needs 10,000


def supported(q: float, count: int) -> bool:
    """Does a sample of ``count`` calls support percentile ``q`` (see :data:`SUPPORT`)?"""
    return count >= min_samples(q)


def merge_samples(parts: Iterable[Sequence[int]]) -> list[int]:
    """All samples of all workers, sorted ascending (exact merge, nothing averaged)."""
    merged: list[int] = []
    for part in parts:
        merged.extend(part)
    merged.sort()
    return merged


@dataclass(frozen=True)
class ActionStats:
    """One action's figures over the merged samples; latencies in nanoseconds.

    An action with no sample (every call raised) has no latency: its latency
    fields are None (null in JSON, a dash in the tables), never 0, which would
    read as the fastest answer of the run.
    """

    count: int
    miss: int
    p50: int | None
    p90: int | None
    p99: int | None
    p999: int | None
    max: int | None
    total: int | None
    errors: int = 0
    #: None in results written before it was recorded (schema 1), or with no sample.
    p9999: int | None = None
    #: Gets that returned a value the workload never stored for that key (verify.py).
    wrong: int = 0
    #: Gets that returned a value a later acknowledged write had replaced (freshness.py).
    stale: int = 0

    @classmethod
    def from_samples(
        cls,
        samples: Sequence[int],
        miss: int,
        errors: int = 0,
        *,
        presorted: bool = False,
        wrong: int = 0,
        stale: int = 0,
    ) -> ActionStats:
        """Summarise ``samples`` (sorted here unless ``presorted``, as merge_samples gives)."""
        ordered = samples if presorted else sorted(samples)
        if not ordered:
            return cls(0, miss, None, None, None, None, None, None, errors, None, wrong, stale)
        p = {name: int(percentile(ordered, q)) for name, q in PERCENTILES}
        return cls(
            count=len(ordered),
            miss=miss,
            p50=p["p50"],
            p90=p["p90"],
            p99=p["p99"],
            p999=p["p99.9"],
            max=int(ordered[-1]),
            total=int(sum(ordered)),
            errors=errors,
            p9999=p["p99.99"],
            wrong=wrong,
            stale=stale,
        )

    def to_dict(self) -> dict[str, int | None]:
        """JSON form: latency fields carry their unit (``_ns``)."""
        d = asdict(self)
        out = {
            "count": d.pop("count"),
            "miss": d.pop("miss"),
            "errors": d.pop("errors"),
            "wrong": d.pop("wrong"),
            "stale": d.pop("stale"),
        }
        names = {"p999": "p99_9", "p9999": "p99_99"}
        for key, value in d.items():
            out[f"{names.get(key, key)}_ns"] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActionStats:
        def ns(name: str) -> int | None:
            value = data.get(name)
            return None if value is None else int(value)

        count = int(data["count"])
        return cls(
            count=count,
            miss=int(data["miss"]),
            errors=int(data.get("errors", 0)),
            wrong=int(data.get("wrong", 0)),
            stale=int(data.get("stale", 0)),
            p50=ns("p50_ns"),
            p90=ns("p90_ns"),
            p99=ns("p99_ns"),
            p999=ns("p99_9_ns"),
            max=ns("max_ns"),
            # Files written before no-sample latencies were null said 0 for them.
            total=ns("total_ns") if count else None,
            p9999=ns("p99_99_ns"),
        )

    def percentile_points(self) -> list[tuple[float, int]]:
        """(q, ns) for p50, p90, p99, p99.9 and p99.99 (those recorded; none without samples)."""
        points = [(50.0, self.p50), (90.0, self.p90), (99.0, self.p99), (99.9, self.p999),
                  (99.99, self.p9999)]  # fmt: skip
        return [(q, ns) for q, ns in points if ns is not None]

    def latency_points(self) -> list[tuple[str, int]]:
        """(label, ns) for the charts: p50, p90, p99, p99.9, max (none without samples)."""
        points = [("p50", self.p50), ("p90", self.p90), ("p99", self.p99),
                  ("p99.9", self.p999), ("max", self.max)]  # fmt: skip
        return [(label, ns) for label, ns in points if ns is not None]


#: How a latency that does not exist (an action with no sample) is shown.
NO_LATENCY = "\u2013"  # an en dash


def format_ns(ns: float | None) -> str:
    """A latency for people: ``812ns``, ``12.3µs``, ``4.56ms``, ``1.23s``; a dash for None."""
    if ns is None:
        return NO_LATENCY
    if ns < 1_000:
        return f"{ns:.0f}ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.3g}µs" if ns < 100_000 else f"{ns / 1_000:.0f}µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.3g}ms" if ns < 100_000_000 else f"{ns / 1_000_000:.0f}ms"
    if ns < 100_000_000_000:
        return f"{ns / 1_000_000_000:.3g}s"
    return f"{ns / 1_000_000_000:,.0f}s"
