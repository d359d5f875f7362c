"""What a cache counts about itself during the measured ops (``cache_stats``).

Latencies say how fast a TieredCache answered; only the cache can say *where*
the answers came from: how many gets its L1 answered, how many reached the L2,
how often an entry was found stale, and, across simulated hosts
(``COHERENCE="cluster"``), how long an invalidation took to reach the other
host. The issue asking for the cluster target wanted exactly those figures
measured by the harness, next to the latencies they explain.

**Which caches.** Only those whose ``stats()`` is declared read-only in
:data:`READ_ONLY_STATS` (``TieredCache.stats()``, see ``TieredStats`` for
the counters' meanings; ``ShardedSQLiteCache.stats()``). The harness must
never change how a target behaves, and a method named ``stats`` is no
promise of that: diskcache's ``DjangoCache.stats(enable=True, reset=False)``
*switches on* its hit/miss statistics, after which every ``get`` also
updates diskcache's Settings table (a write transaction per read), and
even ``stats(enable=False)`` writes the setting. So a ``stats()`` is
called only when the class that defines it (found along the cache's MRO,
so a subclass that overrides it is not trusted) is in the list; every
other backend records nothing (``cache_stats`` is None: not available).

**Silent failures** (:data:`FAILURE_COUNTERS`). A ShardedSQLiteCache that
gives up on a busy shard, hits an I/O error or finds a value tampered does
not raise: ``set`` returns normally and the lost write is only in its
``stats()`` (``give_ups``, ``voided``, ``errors``, ``tampered``,
``corruptions``). Without these counters the harness counted such a call as
a success and the published results could not show it. They are kept under their own names for a
ShardedSQLiteCache, and with an ``l2_`` prefix for a TieredCache's L2 (read
from the L2's own ``stats()``: the TieredCache's counters do not include
them). Unlike the other figures, repeats *sum* them (:func:`median_runs`): a
give-up in one run must not vanish in a median of zeros.

**Worker side** (:func:`snapshot`, :func:`worker_delta`): two calls per worker,
one right after the warm-up ops and one right after the measured ops, both
outside the timed brackets. The counters (:data:`COUNTERS`, and
:data:`CLUSTER_COUNTERS`) are kept as the difference, so they cover the
measured ops only; the host's propagation figures (:data:`CLUSTER_LEVELS`)
are the end values, because the host file keeps a histogram over the
subscriber's whole life, not a counter that can be differenced (the run's
host directory is fresh, so that life is the run's, set-up included). A
``stats()`` that raises or returns something else records nothing: the
counters are an explanation, never a reason to lose a target's latencies.

**One run** (:func:`merge_workers`): per-process counters are summed over the
workers. The ``cluster_`` figures that belong to a host (its one subscriber
writes them, and every process of the host reads the same:
:data:`HOST_FIGURES`) must not be summed over its processes: per simulated
host, a counter's change is taken from its first worker's start to its last
worker's end (each worker also keeps the host counters' end values for this,
under :data:`HOST_ENDS`), and a life figure is the largest of its workers'
reads of the one host file; then the
host counters are summed over the hosts and the delay and degraded figures
are the worst host's (the largest), with every host's own in
``cluster_per_host``.

**Repeats** (:func:`median_runs`): per figure, the median of the runs'
values, as every other figure of a repeated target (each run keeps its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from djcachebench.bench.footprint import median_footprint

__all__ = [
    "CLUSTER_COUNTERS",
    "CLUSTER_LEVELS",
    "COUNTERS",
    "FAILURE_COUNTERS",
    "HOST_FIGURES",
    "READ_ONLY_STATS",
    "failure_counts",
    "l1_answered",
    "l2_reads",
    "median_runs",
    "merge_workers",
    "read_only_stats",
    "snapshot",
    "worker_delta",
]

#: Per-process counters of a TieredCache, kept as their change over the measured ops.
COUNTERS = (
    "l1_hits",
    "l1_misses",
    "l2_hits",
    "l2_misses",
    "board_hits",
    "invalidations",
    "unserved",
    "l1_bypassed",
    "l1_kept_out",
    "published",
)
#: What a ShardedSQLiteCache counts when it fails without raising (store/stats.py).
FAILURE_COUNTERS = ("give_ups", "voided", "errors", "tampered", "corruptions")
#: The same counters of a TieredCache's L2 (when its L2 keeps them).
L2_FAILURE_COUNTERS = tuple(f"l2_{name}" for name in FAILURE_COUNTERS)
#: Every silent-failure counter, in the order the reports name them.
SILENT = (*FAILURE_COUNTERS, *L2_FAILURE_COUNTERS)
#: Cross-host counters, kept as their change over the measured ops.
CLUSTER_COUNTERS = (
    "cluster_invalidations_sent",
    "cluster_invalidations_applied",
    "cluster_gaps",
    "cluster_epoch_bumps",
)
#: Cross-host figures of the host's whole life, kept as their end values.
CLUSTER_LEVELS = (
    "cluster_delay_ms_p50_at_most",
    "cluster_delay_ms_p99_at_most",
    "cluster_delay_ms_mean",
    "cluster_delay_ms_max",
    "cluster_degraded_seconds",
)
#: A worker's end values of the host's counters (see :func:`_host_span`).
HOST_ENDS = "host_ends"
#: The figures a host's subscriber writes once for all its processes (only
#: ``invalidations_sent`` of the cross-host ones is each process's own).
HOST_FIGURES = (
    "cluster_invalidations_applied",
    "cluster_gaps",
    "cluster_epoch_bumps",
    *CLUSTER_LEVELS,
)


#: The classes whose ``stats()`` (called with no argument) only reads counters
#: the process keeps in memory: no file, table, server or setting is written,
#: and no later call of the cache behaves differently for it. Dotted paths, so
#: that this module imports no backend. Nothing else is called ``stats()`` by
#: the harness (see the module's docstring for what diskcache's would do).
READ_ONLY_STATS = frozenset({
    "djcachebench.backends.sqlite.ShardedSQLiteCache",
    "djcachebench.backends.tiered.TieredCache",
})


def read_only_stats(cache: Any) -> Callable[[], Any] | None:
    """``cache.stats`` when the class defining it is in :data:`READ_ONLY_STATS`, else None.

    The defining class is the first one along ``type(cache).__mro__`` whose
    own namespace has ``stats``: a subclass of a listed class that overrides
    ``stats()`` may do anything in it, so it is not called.
    """
    for klass in type(cache).__mro__:
        if "stats" in vars(klass):
            if f"{klass.__module__}.{klass.__qualname__}" not in READ_ONLY_STATS:
                return None
            stats = getattr(cache, "stats", None)
            return stats if callable(stats) else None
    return None


def snapshot(cache: Any) -> dict[str, Any] | None:
    """The figures of ``cache.stats()`` this module keeps; None if it has none.

    Only a ``stats()`` declared read-only is called (:func:`read_only_stats`).
    Never raises: a cache without one, one whose ``stats()`` fails, or one
    that returns something other than a dict records nothing.
    """
    stats = read_only_stats(cache)
    if stats is None:
        return None
    try:
        values = stats()
    except Exception:
        return None
    if not isinstance(values, Mapping):
        return None
    kept = (*COUNTERS, *CLUSTER_COUNTERS, *CLUSTER_LEVELS, *FAILURE_COUNTERS)
    out = {key: values[key] for key in kept if key in values}
    l2 = _l2_stats(cache)
    out.update({f"l2_{key}": l2[key] for key in FAILURE_COUNTERS if key in l2})
    return out


def _l2_stats(cache: Any) -> Mapping[str, Any]:
    """The ``stats()`` of a TieredCache's L2 (its public ``l2``), or an empty dict.

    A give-up of the L2 is otherwise invisible to the harness (the
    TieredCache's own counters do not include it). Any failure reads as no
    figures, like a failing ``stats()``; an L2 whose ``stats()`` is not
    declared read-only (a diskcache L2) is not asked.
    """
    l2 = getattr(cache, "l2", None)
    stats = None if l2 is None else read_only_stats(l2)
    if stats is None:
        return {}
    try:
        values = stats()
    except Exception:
        return {}
    return values if isinstance(values, Mapping) else {}


def worker_delta(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The counters' change between two snapshots, and the levels' end values.

    None when either snapshot is missing or a figure is not a number (a
    ``stats()`` of another shape than TieredCache's is not guessed at).
    """
    if before is None or after is None:
        return None
    out: dict[str, Any] = {}
    for key in (*COUNTERS, *CLUSTER_COUNTERS, *SILENT):
        if key in before and key in after:
            start, end = before[key], after[key]
            if not (_is_int(start) and _is_int(end)):
                return None
            out[key] = end - start
            if key in HOST_FIGURES:
                out.setdefault(HOST_ENDS, {})[key] = end
    for key in CLUSTER_LEVELS:
        if key in after:
            value = after[key]
            if value is not None and not _is_number(value):
                return None
            out[key] = value
    return out or None


def merge_workers(parts: Sequence[tuple[int, Mapping[str, Any] | None]]) -> dict[str, Any] | None:
    """One run's figures from every worker's ``(simulated host, worker_delta)``.

    None unless every worker recorded its figures: a sum over some of the
    workers would understate every counter without saying so.
    """
    if not parts or any(stats is None for _, stats in parts):
        return None
    workers = [stats for _, stats in parts if stats is not None]
    out: dict[str, Any] = {"workers": len(workers)}
    for key in (*COUNTERS, *SILENT):
        if all(key in w for w in workers):
            out[key] = sum(w[key] for w in workers)
    if any(key in out for key in COUNTERS):  # a TieredCache's counters
        answered, reads = l1_answered(out), l2_reads(out)
        gets = None if answered is None or reads is None else answered + reads
        out["l1_share"] = answered / gets if gets else None  # type: ignore[operator]
    if any(key.startswith("cluster_") for w in workers for key in w):
        out.update(_cluster(parts))
    return out


def _cluster(parts: Sequence[tuple[int, Mapping[str, Any] | None]]) -> dict[str, Any]:
    """The cross-host figures: per host, then over the hosts (see the module's docstring)."""
    hosts: dict[int, list[Mapping[str, Any]]] = {}
    for host, stats in parts:
        if stats is not None:
            hosts.setdefault(host, []).append(stats)
    per_host = []
    for host, members in sorted(hosts.items()):
        figures: dict[str, Any] = {"host": host, "workers": len(members)}
        for key in HOST_FIGURES:
            figures[key] = _largest(m.get(key) for m in members)
        for key in CLUSTER_COUNTERS[1:]:
            span = _host_span(members, key)
            if span is not None:
                figures[key] = span
        per_host.append(figures)
    sent = [m["cluster_invalidations_sent"] for _, m in parts
            if m is not None and "cluster_invalidations_sent" in m]  # fmt: skip
    out: dict[str, Any] = {
        "cluster_hosts": len(per_host),
        "cluster_invalidations_sent": sum(sent) if sent else None,
    }
    for key in CLUSTER_COUNTERS[1:]:
        values = [h[key] for h in per_host if h.get(key) is not None]
        out[key] = sum(values) if values else None
    for key in CLUSTER_LEVELS:
        out[key] = _largest(h.get(key) for h in per_host)
    out["cluster_per_host"] = per_host
    return out


def _host_span(members: Sequence[Mapping[str, Any]], key: str) -> int | None:
    """A host counter's change from its first worker's start to its last one's end.

    The host's workers start and end their measured ops at different times
    (each after its own warm-up): one worker's window misses what the host
    applied while only the others measured, a large share on a loaded
    machine. The counter is the host's, so the span of
    all its workers' windows is read from their end values and deltas.
    None when a worker lacks them (its own largest delta is used instead).
    """
    ends = [m.get(HOST_ENDS, {}).get(key) for m in members]
    if any(end is None or key not in m for end, m in zip(ends, members, strict=True)):
        return None
    starts = [end - m[key] for end, m in zip(ends, members, strict=True)]
    return max(ends) - min(starts)  # type: ignore[type-var, no-any-return]


def median_runs(runs: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """Per figure, the median of the runs' values; None if any run lacks them.

    The silent-failure counters are summed instead (see the module's docstring).
    """
    if not runs or any(r is None for r in runs):
        return None
    out: dict[str, Any] = median_footprint(list(runs))
    for key in SILENT:
        values = [r.get(key) for r in runs if r is not None]
        if values and all(_is_int(v) for v in values):
            out[key] = sum(values)
    return out


def failure_counts(stats: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The non-zero silent-failure counters; None when the cache counts none.

    None (shown as a dash) and ``{}`` (shown as 0) differ: a cache without
    such counters may fail silently without the harness knowing.
    """
    if not stats or not any(key in stats for key in SILENT):
        return None
    return {key: stats[key] for key in SILENT if _is_int(stats.get(key)) and stats[key]}


def l1_answered(stats: Mapping[str, Any]) -> int | None:
    """Gets the L1 answered without the L2: hits and known absences.

    A value-board answer (``board_hits``) is already counted here: the
    TieredCache counts it as an L1 hit or miss as well, so adding
    ``board_hits`` would count it twice.
    """
    hits, misses = stats.get("l1_hits"), stats.get("l1_misses")
    return None if hits is None or misses is None else hits + misses


def l2_reads(stats: Mapping[str, Any]) -> int | None:
    """Gets that reached the L2 (its hits and misses)."""
    hits, misses = stats.get("l2_hits"), stats.get("l2_misses")
    return None if hits is None or misses is None else hits + misses


def _largest(values: Any) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
