"""Tables for people: the terminal text and ``report.md``, from a Results only.

Both render the same table per backend (Action, Count, Miss, Median, P90,
P99, Max, Total, then wall time and ops/s), after python-diskcache's and
memtier's familiar columns. They take a :class:`Results` loaded from
``results.json``, never the runner's in-memory state, so a report can be
re-made from any saved run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from djcachebench.bench.cache_stats import failure_counts
from djcachebench.bench.cache_stats_report import (
    COUNTERS_NOTE,
    counter_rows,
    counters_line,
    tiered_counters,
)
from djcachebench.bench.concurrency import describe_concurrency, lanes_label
from djcachebench.bench.footprint import per_entry
from djcachebench.bench.formats import (
    PER_PROCESS_NOTE,
    PERCENTILE_NOTE,
    backend_label,
    describe_ops,
    format_bytes,
    format_percentile,
    ops_per_process,
    ops_phrase,
    plan_line,
)
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.stats import format_ns, percentile, supported
from djcachebench.bench.summary import TOLERANCE, Interval, coverage_note

COLUMNS = ("Action", "Count", "Miss", "Errors", "Wrong", "Stale", "Median", "P90", "P99", "Max",
           "Total")  # fmt: skip
REPEAT_COLUMNS = ("Figure", "Median", "Interval", "Runs", "Flag")
#: The figures of the repeats table (all of them are in results.json).
REPEAT_FIGURES = ("p50", "p90", "p99", "p99.9")


def repeat_rows(backend: BackendResult) -> list[list[str]]:
    """Per figure: median, interval, every run's value, and the unstable flag."""
    summary = backend.summary()
    rows = []
    for figure, interval in summary.items():
        action, _, label = figure.partition(" ")
        if figure != "ops/s" and label not in REPEAT_FIGURES:
            continue
        fmt = _rate if figure == "ops/s" else format_ns
        values = (
            [r.ops_per_s for r in backend.runs]
            if figure == "ops/s"
            else [_figure(r, action, label) for r in backend.runs]
        )
        rows.append(
            [
                figure,
                fmt(interval.median),
                f"{fmt(interval.low)} - {fmt(interval.high)}",
                " ".join(fmt(v) for v in values),
                "UNSTABLE" if interval.unstable else "",
            ]
        )
    return rows


def _figure(run: BackendResult, action: str, label: str) -> float:
    stats = run.actions[action]
    return float({"p50": stats.p50, "p90": stats.p90, "p99": stats.p99, "p99.9": stats.p999}[label])


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def repeat_note(results: Results) -> str:
    """The line that says how the repeats are summarised."""
    n = results.run.get("repeat", 1)
    return (
        f"Figures are per-figure medians of {n} interleaved runs (each run's percentiles "
        f"from its own samples); {coverage_note(n)}. UNSTABLE: the interval reaches more "
        f"than {TOLERANCE:.0%} of the median away from it."
    )


FOOTPRINT_COLUMNS = (
    "Backend",
    "Entries",
    "RSS change/worker (median, max)",
    "Private change/worker (median)",
    "Server memory",
    "Disk (WAL)",
    "Disk/entry",
    "Server/entry",
    "RSS/entry",
)
FOOTPRINT_NOTE = (
    "After the run: RSS change of each worker from the start barrier to its last op "
    "(less its own latency samples; signed: a negative change is a worker that ended "
    "smaller than it started, e.g. memory freed after the pre-fill or sample pages never "
    "touched), and of its private pages (RSS less pages shared "
    "with a file mapping, such as TieredCache's generation table); the server's memory "
    "as it reports it (redis `used_memory`, memcached `bytes`; per entry: redis "
    "`used_memory_dataset`); bytes "
    "allocated on disk with SQLite's WAL still open; entries counted by probing the keys "
    "(~: estimated from a sample). Per-process caches hold their entries in every worker."
)


def footprint_rows(results: Results) -> list[list[str]]:
    """One row per backend with a footprint (none for results written before it)."""
    rows = []
    for backend in results.backends:
        fp = backend.footprint
        if not fp:
            continue
        growth = sorted(fp.get("rss_growth_bytes") or [])
        entries = fp.get("entries")
        server = fp.get("server") or {}
        disk = fp.get("disk")
        each = per_entry(fp)
        rows.append(
            [
                backend_label(results, backend.name),
                "-"
                if entries is None
                else ("~" if fp.get("entries_estimated") else "") + f"{entries:,}",
                f"{format_bytes(percentile(growth, 50), signed=True)}, "
                f"{format_bytes(growth[-1], signed=True)}"
                if growth
                else "-",
                _median_bytes(fp.get("private_growth_bytes")),
                f"{format_bytes(server['memory_bytes'])} ({server['kind']})"
                if server.get("memory_bytes") is not None
                else "-",
                f"{format_bytes(disk['bytes'])} ({format_bytes(disk['wal_bytes'])})"
                if disk
                else "-",
                _maybe_bytes(each["disk"]),
                _maybe_bytes(each["server"]),
                _maybe_bytes(each["rss"], signed=True),
            ]
        )
    return rows


def _median_bytes(values: list[int] | None) -> str:
    """The median worker's figure (absent in results written before it was measured)."""
    if not values:
        return "-"
    return format_bytes(percentile(sorted(values), 50), signed=True)


def _maybe_bytes(n: float | None, signed: bool = False) -> str:
    return "-" if n is None else format_bytes(n, signed)


def table_rows(backend: BackendResult) -> list[list[str]]:
    """The rows of one backend's table, formatted."""
    rows = []
    for action, s in backend.actions.items():
        rows.append(
            [
                action,
                f"{s.count:,}",
                f"{s.miss:,}",
                f"{s.errors:,}",
                f"{s.wrong:,}",
                f"{s.stale:,}",
                format_percentile(s.p50, 50, s.count),
                format_percentile(s.p90, 90, s.count),
                format_percentile(s.p99, 99, s.count),
                format_ns(s.max),
                format_ns(s.total),
            ]
        )
    return rows


def wall_line(backend: BackendResult) -> str:
    """Wall, ops and ops/s (one run's, with repeats), and the get miss rate beside them:
    a capped cache that misses most gets looks fast for it."""
    line = f"wall time {backend.wall_s:.3f}s, {backend.ops:,} ops, {backend.ops_per_s:,.0f} ops/s"
    get = backend.actions.get("get")
    return line + (f", get miss {miss_rate(get)}" if get is not None and get.count else "")


def render_text(results: Results) -> str:
    """The terminal report: a fixed-width table per backend, then skips and warnings."""
    out: list[str] = [_headline(results), ""]
    widths = [8, 10, 9, 9, 7, 7, 9, 9, 9, 9, 9]
    rule = " ".join("=" * w for w in widths)
    for backend in results.backends:
        note = results.targets.get(backend.name, {}).get("note")
        out.append(f"{backend.name}" + (f"  ({note})" if note else ""))
        out.append(rule)
        out.append(" ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True)))
        out.append(rule)
        for row in table_rows(backend):
            out.append(" ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        out.append(rule)
        out.append(wall_line(backend))
        out += [f"budget: {line}" for line in [plan_line(results, backend)] if line]
        out += [f"FAILED: {why}" for why in backend.failures]
        out += [f"STALE: {why}" for why in backend.stale]
        out += [f"GAVE UP: {line}" for line in [gave_up_line(backend)] if line]
        out += [f"note: {note}" for note in backend.notes]
        if backend.runs:
            out.append(f"over {len(backend.runs)} runs:")
            for figure, median, interval, runs, flag in repeat_rows(backend):
                out.append(f"  {figure:<14}{median:>10}  {interval:>21}  {flag:<8}  runs: {runs}")
        out.append("")
    rows = footprint_rows(results)
    if rows:
        out.append("memory and disk after the run:")
        out.append("  " + " | ".join(FOOTPRINT_COLUMNS))
        out += ["  " + " | ".join(row) for row in rows]
        out.append("")
    lines = [line for line in map(counters_line, results.backends) if line]
    if lines:
        out.append("TieredCache counters over the measured ops:")
        out += ["  " + line for line in lines]
        out.append("")
    if any(_thin(b) for b in results.backends):
        out.append(PERCENTILE_NOTE)
    if any(results.per_process(b.name) for b in results.backends):
        out.append(PER_PROCESS_NOTE)
    for skip in results.skipped:
        out.append(f"{skip.status.upper()} {skip.name}: {skip.reason}")
    for warning in results.warnings:
        out.append(f"WARNING: {warning}")
    if results.run.get("repeat", 1) > 1:
        out.append(repeat_note(results))
    return "\n".join(out).rstrip() + "\n"


def render_markdown(results: Results, charts: Sequence[str] = ()) -> str:
    """``report.md``: method line, machine, summary, a table per backend, charts, settings."""
    m = results.machine
    sc = results.scenario
    run = results.run
    mix = ", ".join(f"{k} {v:g}" for k, v in sc["mix"].items() if v)
    out = [
        f"# djcachebench: {sc['name']} scenario, {describe_ops(results)}",
        "",
        f"Run {results.created} with `{' '.join(_short_command(results.command))}`"
        + (f" at commit `{results.git}`." if results.git else "."),
        "",
    ]
    for warning in results.warnings:
        out += [f"> **Warning:** {warning}", ""]
    out += [
        "## Machine and workload",
        "",
        f"- CPU: {m.get('cpu_model')}, {m.get('cpu_count')} logical CPUs "
        f"({m.get('usable_cpus')} usable)",
        f"- {m.get('os')}; {m.get('python')}; Django {m.get('django')}; SQLite {m.get('sqlite')}",
        "- Packages: " + ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items() if v),
        f"- Workload: {run['procs']} worker processes ({run['start_method']}), each "
        f"{ops_phrase(results)}; mix {mix}; "
        f"{describe_keys(sc)}; {describe_values(sc)}; "
        f"pre-filled: {'yes' if sc['prefill'] else 'no'}; seed {run['seed']}",
        f"- Concurrency: {describe_concurrency(run, m)}",
        f"- Size bounds: {describe_entry_limits(results)}",
        f"- {describe_provenance(results)}",
        "- Latency: each call timed with `time.perf_counter_ns()`; percentiles are "
        "nearest-rank over all workers' merged samples. Wall time: first measured "
        "op of any worker to last measured op of any worker.",
        "",
    ]
    if results.run.get("repeat", 1) > 1:
        out += [repeat_note(results), ""]
    if results.backends:
        notes = [PERCENTILE_NOTE] if any(_thin(b) for b in results.backends) else []
        if any(results.per_process(b.name) for b in results.backends):
            notes.append(PER_PROCESS_NOTE)
        out += ["## Summary", "", _summary_table(results), "", SUMMARY_NOTE, "",
                *(line for note in notes for line in (note, "")),
                f"Entry limits (a capped cache misses more as the keys outgrow it, and a "
                f"miss is usually faster than a hit): {describe_entry_limits(results)}.", ""]
        failed = [b for b in results.backends if b.failures]
        out += [f"- **{b.name} FAILED:** {'; '.join(b.failures)}" for b in failed]
        stale = [b for b in results.backends if b.stale]
        out += [f"- **{b.name} stale:** {'; '.join(b.stale)}" for b in stale]
        out += [""] if failed or stale else []
    rows = footprint_rows(results)
    if rows:
        out += ["## Memory and disk", "", FOOTPRINT_NOTE, ""]
        out += [_md_table(list(FOOTPRINT_COLUMNS), rows), ""]
    out += _counters_section(results)
    for backend in results.backends:
        target = results.targets.get(backend.name, {})
        out += [f"## {backend_label(results, backend.name)}", ""]
        if target.get("description"):
            out += [
                target["description"] + (f" — {target['note']}." if target.get("note") else ""),
                "",
            ]
        out += [_md_table(list(COLUMNS), table_rows(backend)), "", wall_line(backend) + ".", ""]
        if plan_line(results, backend):
            out += [f"- **Budget:** {plan_line(results, backend)}.", ""]
        if backend.failures:
            out += [f"- **FAILED:** {why}" for why in backend.failures] + [""]
        if backend.stale:
            out += [f"- **Stale:** {why}" for why in backend.stale] + [""]
        if gave_up_line(backend):
            out += [f"- **Gave up:** {gave_up_line(backend)}", ""]
        if backend.notes:
            out += [f"- **Note:** {note}" for note in backend.notes] + [""]
        if backend.runs:
            out += [f"Over {len(backend.runs)} runs:", ""]
            out += [_md_table(list(REPEAT_COLUMNS), repeat_rows(backend)), ""]
    if results.skipped:
        out += ["## Skipped or failed", ""]
        out += [f"- **{s.name}** ({s.status}): {s.reason}" for s in results.skipped]
        out.append("")
    if charts:
        out += ["## Charts", ""]
        out += [f"![{Path(c).stem}]({c})" for c in charts]
        out.append("")
    out += ["## Settings of each target", "", "```json"]
    out.append(json.dumps({n: t.get("settings") for n, t in results.targets.items()}, indent=2))
    out += ["```", ""]
    return "\n".join(out)


def _counters_section(results: Results) -> list[str]:
    """``## TieredCache counters``: a table per backend that reported them (else nothing)."""
    counted = [b for b in results.backends if tiered_counters(b.cache_stats)]
    if not counted:
        return []
    out = ["## TieredCache counters", "", COUNTERS_NOTE, ""]
    for backend in counted:
        header = ["Figure", "Median", "Runs"] if backend.runs else ["Figure", "Value"]
        out += [f"### {backend.name}", "", _md_table(header, counter_rows(backend)), ""]
    return out


def describe_provenance(results: Results) -> str:
    """Servers (version, command line), the cache files' filesystem, a dirty tree."""
    m = results.machine
    fs = m.get("cache_dir") or {}
    parts = [f"Cache files in `{fs.get('path')}` on {fs.get('fstype') or 'an unknown'} "
             f"filesystem (mount `{fs.get('mount')}`)" if fs else "Cache directory not recorded"]
    for kind, info in (m.get("servers") or {}).items():
        parts.append(f"{kind}: {info.get('version') or 'version unknown'}, "
                     f"`{' '.join(info.get('command') or [])}`")
    if results.git and results.git.endswith("+dirty"):
        parts.append("**the checkout had uncommitted changes** (`+dirty`)")
    return "; ".join(parts)


def describe_keys(sc: Mapping[str, Any]) -> str:
    """``1,100 bytes keys, uniform`` (results written before keys were configurable: bytes)."""
    popularity = sc.get("key_popularity", "uniform")
    if popularity == "zipf":
        popularity = f"Zipf s={sc.get('zipf_s', 1.0):g}"
    return f"{sc['keys']:,} {sc.get('key_type', 'bytes')} keys, {popularity}"


def entry_limit(entry: Mapping[str, Any]) -> int | None:
    """The ``MAX_ENTRIES`` of a recorded CACHES entry (or of its inline L2), if it sets one."""
    options = entry.get("OPTIONS") or {}
    if options.get("MAX_ENTRIES") is not None:
        return int(options["MAX_ENTRIES"])
    l2 = options.get("L2")
    return entry_limit(l2) if isinstance(l2, Mapping) else None


def describe_entry_limits(results: Results) -> str:
    """Which targets bound their entry count and how, from the recorded settings.

    ``MAX_ENTRIES 2,000,000: locmem, sqlite, tiered (room for every key, the
    scenario's max_entries = "keys"); redis: no key-count limit (...)``. A
    reader comparing miss rates needs this next to the workload: a 1,000-key
    cache and a cache holding every key answer different questions.
    """
    bounded: dict[int, list[str]] = {}
    others: list[str] = []
    for name, target in results.targets.items():
        caches = (target.get("settings") or {}).get("CACHES", {})
        limit = entry_limit(caches.get("default", {}))
        if limit is None:
            others.append(f"{name}: {target.get('note') or 'no MAX_ENTRIES'}")
        else:
            bounded.setdefault(limit, []).append(name)
    parts = [f"`MAX_ENTRIES` {limit:,}: {', '.join(names)}" for limit, names in bounded.items()]
    if parts and results.scenario.get("max_entries") == "keys":
        parts[-1] += ' (room for every key: the scenario\'s `max_entries = "keys"`, so none culls)'
    return "; ".join(parts + others) or "none recorded"


def describe_values(sc: Mapping[str, Any]) -> str:
    """``bytes values of 1-495 bytes (uniform), a fresh one per set``."""
    kind = sc.get("value_kind", "bytes")
    if kind == "int":
        return "int values (counters)"
    lo, hi = sc["value_min"], sc["value_max"]
    dist = sc.get("value_dist", "uniform")
    if dist == "fixed":
        size = _size(lo)
    elif hi < 1_000:
        size = f"{lo}-{hi} bytes ({dist})"
    else:
        size = f"{_size(lo)}-{_size(hi)} ({dist})"
    pool = sc.get("value_pool", 0)
    source = (
        "a fresh one per set"
        if pool == 0
        else f"from a pool of {pool}"
        if pool
        else "from a per-process pool"
    )
    return f"{kind} values of {size}, {source}"


def _size(n: int) -> str:
    for unit, scale in (("MB", 1_000_000), ("KB", 1_000)):
        if n >= scale and n % (scale // 100) == 0:
            return f"{n / scale:g} {unit}"
    return f"{n:,} bytes"


def write_report(results_path: str | Path, charts: Sequence[str] = ()) -> Path:
    """Read ``results.json`` and write ``report.md`` beside it."""
    results_path = Path(results_path)
    results = Results.load(results_path)
    report = results_path.with_name("report.md")
    report.write_text(render_markdown(results, charts))
    return report


SUMMARY_NOTE = (
    "get miss: gets that found no value, of all gets that returned (compare latencies only "
    "between targets with similar miss rates). Errors: calls that raised (not in the "
    "latencies nor in ops/s); Wrong: gets that returned a value the workload never stored "
    "for that key; Stale: gets that returned a value an acknowledged earlier write of the "
    "key had replaced (a lost write or a stale copy; for a cache private to each process "
    "or host, only those its own process or host had replaced count); with repeats these "
    "are totals over the runs. Gave up: what the cache itself counted as failed without "
    "raising (a ShardedSQLiteCache that gave up on a busy shard: its `set` returned, the "
    "write was lost; `l2` for a TieredCache's L2), summed over the runs; a dash: the cache "
    "counts no such thing. A dash elsewhere: no call of that action returned, so it has no "
    "latency. FAILED: every call of an action raised, or the cache returned wrong values: "
    "its figures are not a result. stale: the figures stand, but the cache returned values "
    "that acknowledged writes had replaced. flagged: some calls raised or gave up: the "
    "figures count them as done (gave up) or leave them out (errors), so read them with "
    "that share in mind."
)


def silent_failures(backend: BackendResult) -> str:
    """The Summary's "Gave up" cell: the non-zero counters, 0, or a dash (none counted)."""
    counts = failure_counts(backend.cache_stats)
    if counts is None:
        return "-"
    return ", ".join(f"{name.replace('_', ' ')} {n:,}" for name, n in counts.items()) or "0"


def gave_up_line(backend: BackendResult) -> str | None:
    """A sentence for a target whose cache counted silent failures, else None."""
    if not failure_counts(backend.cache_stats):
        return None
    return (f"{silent_failures(backend)} (counted by the cache itself; those calls returned "
            f"normally and are in the latencies and ops/s as if they had succeeded)")


def status(backend: BackendResult) -> str:
    """``**FAILED**``, ``**stale**`` (acknowledged writes not seen), ``flagged`` (calls
    raised or the cache gave up) or ``ok``."""
    if backend.failures:
        return "**FAILED**"
    if backend.stale:
        return "**stale**"
    errors = sum(s.errors for s in backend.actions.values())
    return "flagged" if errors or failure_counts(backend.cache_stats) else "ok"


def miss_rate(stats: Any) -> str:
    """Misses over the calls that returned, or a dash when none returned."""
    return f"{stats.miss / stats.count:.1%}" if stats is not None and stats.count else "-"


def _summary_table(results: Results) -> str:
    header = ["Backend", "Ops/process", "ops/s", "Wall", "get miss", "get p50", "get p99",
              "set p50", "set p99", "Errors", "Wrong", "Stale", "Gave up", "Status"]  # fmt: skip
    rows = []
    for b in results.backends:
        get, set_ = b.actions.get("get"), b.actions.get("set")
        rate = b.summary().get("ops/s")
        errors = sum(s.errors for s in b.actions.values())
        calls = errors + sum(s.count for s in b.actions.values())
        if b.runs:  # errors are totals over the runs: so are the calls they are of
            calls = sum(s.errors + s.count for r in b.runs for s in r.actions.values())
        rows.append(
            [
                backend_label(results, b.name),
                ops_per_process(results, b),
                _with_interval(rate, _rate) if rate else f"{b.ops_per_s:,.0f}",
                f"{b.wall_s:.2f}s",
                miss_rate(get),
                format_percentile(get.p50, 50, get.count) if get else "-",
                format_percentile(get.p99, 99, get.count) if get else "-",
                format_percentile(set_.p50, 50, set_.count) if set_ else "-",
                format_percentile(set_.p99, 99, set_.count) if set_ else "-",
                f"{errors:,} of {calls:,}" if errors else "0",
                f"{sum(s.wrong for s in b.actions.values()):,}",
                f"{sum(s.stale for s in b.actions.values()):,}",
                silent_failures(b),
                status(b),
            ]
        )
    return _md_table(header, rows)


def _with_interval(interval: Interval, fmt: Any) -> str:
    flag = " (unstable)" if interval.unstable else ""
    return f"{fmt(interval.median)} [{fmt(interval.low)} - {fmt(interval.high)}]{flag}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _thin(backend: BackendResult) -> bool:
    """Has any of the backend's reported percentiles too few calls behind it?"""
    return any(s.count and not supported(99, s.count) for s in backend.actions.values())


def _headline(results: Results) -> str:
    run, m = results.run, results.machine
    procs = f"{run['procs']} procs{lanes_label(run)}"
    ops = (f"{procs}, ops sized by a {run['budget_s']:g} s budget per target"
           if run.get("budget_s") else f"{procs} x {run['ops']:,} ops")  # fmt: skip
    return (
        f"djcachebench {results.scenario['name']}: {ops} "
        f"(+{run['warmup']:,} warm-up), seed {run['seed']}"
        + (f", {run['repeat']} runs" if run.get("repeat", 1) > 1 else "")
        + f"; {m.get('cpu_model')}, "
        f"{m.get('usable_cpus')} usable CPU(s)"
    )


def _short_command(command: Sequence[str]) -> list[str]:
    """The command as typed, with the executable shortened to its name."""
    if not command:
        return ["djcachebench bench"]
    return [Path(command[0]).name, *command[1:]]
