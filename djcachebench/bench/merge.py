"""Merging one run's worker results into a target's figures, with the checks on its answers.

Why a module of its own: the runner orchestrates processes and servers; what
a run *means* -- exact percentiles over every worker's samples, errors and
silent failures per action, wrong and stale answers (verify.py,
freshness.py), the cache's own counters per simulated host (cache_stats.py)
-- is decided here, after the workers have stopped, from their result files
alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from djcachebench.bench.cache_stats import merge_workers
from djcachebench.bench.freshness import Scope, Staleness, count_stale
from djcachebench.bench.results import BackendResult
from djcachebench.bench.stats import ActionStats, merge_samples
from djcachebench.bench.verify import Replay, answered_keys, count_wrong
from djcachebench.bench.worker import WorkerResult
from djcachebench.bench.workload import ACTIONS, Scenario


def merge_results(
    name: str,
    parts: Sequence[WorkerResult],
    scenario: Scenario,
    seed: int = 0,
    verify: bool = True,
    per_process: bool = False,
    host_bound: float = 0.0,
) -> BackendResult:
    """All workers' raw samples merged per action; wall time from first start to last end.

    Calls that raised are counted per action (``errors``) and named in the
    backend's notes, with the pre-fill's refused values. The values the gets
    returned, and the entries worker 0 counted, are checked against what the
    workload stored (``verify``: only when the cache was cleared before the
    run, else an earlier run's values are legitimately there; verify.py).
    A target whose calls of an action all raised, or that returned a wrong
    value, gets ``failures``: it ran, but its figures are not a result. Each
    get's answer is also checked for freshness (freshness.py): a value an
    acknowledged earlier write had replaced is *stale*; those the cache's
    promise covers (``per_process``: only the reader's own writes;
    ``host_bound``: another simulated host's writes from that many seconds
    after their acknowledgement) go to ``stale`` -- the figures stand, the
    promise broke (a lost write, a stale copy) -- and the others to the
    notes. The cache's own counters, where it keeps any, are merged per
    simulated host (cache_stats.py).
    """
    processes = parts
    # One part per caller: a process's threads or tasks each (WorkerResult.streams).
    parts = [stream for part in processes for stream in part.streams()]
    wrong = bad_entries = 0
    example = None
    staleness = Staleness()
    if verify:
        keys = answered_keys((p.seen for p in parts), parts[0].entry_prints)
        replay = Replay(scenario, seed, keys, parts[0].prefill_cap)
        wrong, bad_entries, example = count_wrong(
            (p.seen for p in parts),
            scenario,
            seed,
            parts[0].prefill_cap,
            parts[0].entry_prints,
            replay,
        )
        scope = Scope(per_process, tuple(p.host for p in parts), round(host_bound * 1e9),
                      tuple(p.index for p in parts))
        warmups = [scenario.stream_counts(s)[0] for s in range(len(parts))]
        staleness = count_stale([p.history for p in parts], replay, warmups, scope)
        del replay
    actions: dict[str, ActionStats] = {}
    notes: list[str] = []
    failures: list[str] = []
    stale_found: list[str] = []
    for action in ACTIONS:
        if scenario.fractions().get(action, 0) == 0:
            continue
        merged = merge_samples(part.latencies(action) for part in parts)
        miss = sum(part.miss.get(action, 0) for part in parts)
        kinds = _add_counts(part.errors.get(action, {}) for part in parts)
        errors = sum(kinds.values())
        bad = wrong if action == "get" else 0
        stale = staleness.held if action == "get" else 0
        actions[action] = ActionStats.from_samples(
            merged, miss, errors, presorted=True, wrong=bad, stale=stale
        )
        if errors:
            calls = len(merged) + errors
            notes.append(
                f"{action}: {errors:,} of {calls:,} calls raised {_named(kinds)} "
                f"(counted as errors, not in the latencies)"
            )
            if not merged:
                failures.append(f"{action}: every call raised ({_named(kinds)})")
        if bad:
            failures.append(
                f"{action}: {bad:,} of {len(merged):,} answers were wrong values, not one "
                f"the workload stored for the key (e.g. {example})"
            )
        if stale:
            stale_found.append(
                f"{action}: {stale:,} of {len(merged):,} answers were stale: a value an "
                f"acknowledged earlier write of the key had replaced (e.g. {staleness.example})"
            )
        excused = staleness.stale - staleness.held if action == "get" else 0
        if excused:
            notes.append(f"{action}: {excused:,} answers were stale against {_beyond(per_process)}"
                         f" (reported, not held against it)")
    if bad_entries:
        failures.append(
            f"entries: {bad_entries:,} of the entries counted hold a wrong value (e.g. {example})"
        )
    gets = actions.get("get")
    if (verify and gets is not None and gets.count and gets.miss == gets.count
            and (scenario.prefill or scenario.fractions().get("set", 0) > 0)):
        # A cache that keeps nothing (Django's DummyCache, a broken store) is
        # fastest at everything: its figures are not a cache's, and it would
        # be ranked first, "ok".
        failures.append(f"get: every one of {gets.count:,} gets missed, although the "
                        f"workload stored its keys: the cache kept nothing")
    hops = processes[0].async_defaults
    if hops:
        notes.append(f"tasks: {', '.join(hops)} are Django's defaults, sync_to_async of the "
                     f"sync method: a thread hop per call (a thread per task's context)")
    refused = _add_counts(part.prefill_refused for part in parts)
    if refused:
        notes.append(f"pre-fill: {sum(refused.values()):,} values refused ({_named(refused)})")
    wall_ns = max(p.end_ns for p in parts) - min(p.start_ns for p in parts)
    footprint = worker_footprint(parts, bad_entries, scenario.keys)
    return BackendResult(
        name=name,
        actions=actions,
        wall_s=wall_ns / 1e9,
        ops=sum(s.count for s in actions.values()),
        notes=notes,
        footprint=footprint,
        cache_stats=merge_workers([(p.host, p.cache_stats) for p in processes]),
        failures=failures,
        stale=stale_found,
    )


def _beyond(per_process: bool) -> str:
    """The writes a cache does not promise to see, for the note on excused stale answers."""
    if per_process:
        return "other processes' writes: a per-process cache does not see them"
    return "other simulated hosts' writes younger than the cross-host bound"


def worker_footprint(
    parts: Sequence[WorkerResult], bad_entries: int = 0, keys: int = 0
) -> dict[str, Any]:
    """RSS per worker, and worker 0's entries and disk figures (see footprint.py).

    ``bad_entries``: entries worker 0 found holding a wrong value (verify.py),
    left out of the count: a cache holding garbage holds no entries.
    """
    growth = [
        p.rss_end - p.rss_start for p in parts if p.rss_end is not None and p.rss_start is not None
    ]
    first = parts[0]
    entries = dict(first.entries or {})
    if entries and bad_entries and first.entry_prints is not None:
        good = len(first.entry_prints) - bad_entries
        probed = entries.get("probed") or 0
        estimated = entries.get("estimated") and probed
        entries["entries"] = round(good * keys / probed) if estimated else good
    return {
        "rss_growth_bytes": growth,
        "rss_bytes": [p.rss_end for p in parts if p.rss_end is not None],
        "private_growth_bytes": [
            p.private_end - p.private_start
            for p in parts
            if p.private_end is not None and p.private_start is not None
        ],
        "entries": entries.get("entries"),
        "entries_probed": entries.get("probed"),
        "entries_estimated": entries.get("estimated"),
        "entries_wrong": bad_entries,
        "disk": first.disk,
        "server": None,
    }


def _add_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in counts:
        for name, n in part.items():
            total[name] = total.get(name, 0) + n
    return total


def _named(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} x{n:,}" for name, n in sorted(counts.items()))


