"""The report's "TieredCache counters": rows from a backend's ``cache_stats``.

Split from report.py by job: the figures are defined and merged in
cache_stats.py, formatted here, and report.py places them (a table per
backend in ``report.md``, a line per backend in the terminal). Like every
report, it reads only a :class:`Results` loaded from ``results.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from djcachebench.bench.cache_stats import COUNTERS, l1_answered, l2_reads
from djcachebench.bench.results import BackendResult
from djcachebench.bench.stats import percentile

__all__ = [
    "COUNTERS_NOTE",
    "COUNTER_ROWS",
    "counter_rows",
    "counter_value",
    "counters_line",
    "tiered_counters",
]

COUNTERS_NOTE = (
    "What each TieredCache counted itself over the measured ops (its `stats()`, read "
    "by every worker after the warm-up and after its last op; summed over the workers). "
    "**L1 share of gets**: the gets its L1 answered without reaching the L2 (hits, known "
    "absences, and values from the value board, which the cache counts as L1 hits too) "
    "over all gets. Across simulated hosts: invalidations sent by every process over its "
    "measured ops, and applied by each host's subscriber while any of the host's "
    "processes measured (so the two agree only roughly); the propagation delay (a "
    "write's stamp to the other host's apply) is each host's over its life (the warm-up "
    "included), and the worst host's is shown: p50 and p99 are upper edges of the "
    'histogram buckets (four per doubling), so each is an "at most".'
)


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _share(x: float) -> str:
    return f"{x:.1%}"


def _at_most_ms(ms: float) -> str:
    return f"≤ {ms:.3g} ms"


def _ms(ms: float) -> str:
    return f"{ms:.3g} ms"


def _seconds(s: float) -> str:
    return f"{s:.3g} s"


#: The rows of a TieredCache's counters table: (label, figure, format); a figure
#: is a key of ``cache_stats`` or a function of it.
COUNTER_ROWS: tuple[tuple[str, Any, Any], ...] = (
    ("L1 share of gets", "l1_share", _share),
    ("Gets answered by the L1 (hits, known absences)", l1_answered, _count),
    ("L2 reads (gets that reached the L2)", l2_reads, _count),
    ("Value-board answers", "board_hits", _count),
    ("Invalidations (L1 entry found stale)", "invalidations", _count),
    ("Unserved (table not trusted: read from the L2)", "unserved", _count),
    ("L1 fills bypassed (admission gate closed)", "l1_bypassed", _count),
    ("First misses kept out of a full L1 (doorkeeper)", "l1_kept_out", _count),
    ("Values published to the board", "published", _count),
    ("Invalidations sent (all processes)", "cluster_invalidations_sent", _count),
    ("Invalidations applied (all hosts)", "cluster_invalidations_applied", _count),
    ("Gaps (lost messages: all L1 dropped)", "cluster_gaps", _count),
    ("Epoch bumps", "cluster_epoch_bumps", _count),
    ("Propagation p50 (worst host)", "cluster_delay_ms_p50_at_most", _at_most_ms),
    ("Propagation p99 (worst host)", "cluster_delay_ms_p99_at_most", _at_most_ms),
    ("Propagation mean (worst host)", "cluster_delay_ms_mean", _ms),
    ("Propagation max", "cluster_delay_ms_max", _ms),
    ("Degraded: L1 hits off (worst host)", "cluster_degraded_seconds", _seconds),
)


def tiered_counters(stats: Mapping[str, Any] | None) -> bool:
    """Do these figures hold a TieredCache's counters? (A ShardedSQLiteCache's
    hold only its silent-failure counters, shown in the Summary instead.)"""
    return bool(stats) and any(key in stats for key in COUNTERS)  # type: ignore[operator]


def counter_rows(backend: BackendResult) -> list[list[str]]:
    """Figure and value, or with repeats: figure, median and every run's value.

    A figure the cache did not report (the cluster rows of a one-host
    target) is left out; one reported without a value (no delay measured
    yet) shows as "-".
    """
    stats = backend.cache_stats
    if not stats:
        return []
    rows = []
    for label, figure, fmt in COUNTER_ROWS:
        if isinstance(figure, str) and figure not in stats:
            continue
        row = [label, _shown(counter_value(backend, figure), fmt)]
        if backend.runs:
            row.append(" ".join(_shown(_figure_of(r.cache_stats, figure), fmt)
                                for r in backend.runs))  # fmt: skip
        rows.append(row)
    return rows


def counter_value(backend: BackendResult, figure: Any) -> Any:
    """A figure of the backend's counters: its run's, or the median of its runs'.

    A derived figure (``l2_reads``) is derived in each run, then the median
    taken, as for every other figure: a sum of medians is no run's value.
    """
    if not backend.runs:
        return _figure_of(backend.cache_stats, figure)
    values = [_figure_of(r.cache_stats, figure) for r in backend.runs]
    return None if None in values else percentile(sorted(values), 50)


def _figure_of(stats: Mapping[str, Any] | None, figure: Any) -> Any:
    if stats is None:
        return None
    return stats.get(figure) if isinstance(figure, str) else figure(stats)


def _shown(value: Any, fmt: Any) -> str:
    return "-" if value is None else str(fmt(value))


def counters_line(backend: BackendResult) -> str | None:
    """The terminal's one line per TieredCache target (None for other backends)."""
    stats = backend.cache_stats
    if not stats or not tiered_counters(stats):
        return None
    shown: list[tuple[str, Any, Any]] = [
        ("L1 share", "l1_share", _share),
        ("L2 reads", l2_reads, _count),
        ("board", "board_hits", _count),
        ("unserved", "unserved", _count),
    ]
    if "cluster_gaps" in stats:
        shown += [
            ("sent", "cluster_invalidations_sent", _count),
            ("applied", "cluster_invalidations_applied", _count),
            ("gaps", "cluster_gaps", _count),
            ("propagation p50", "cluster_delay_ms_p50_at_most", _at_most_ms),
            ("p99", "cluster_delay_ms_p99_at_most", _at_most_ms),
        ]
    parts = [f"{label} {_shown(counter_value(backend, f), fmt)}" for label, f, fmt in shown]
    return f"{backend.name}: " + ", ".join(parts)
