"""report.md of ``djcachebench stampede``, from its results file only.

Every figure of a row is the median of its rounds (nearest rank: one round's
own figure, never an average) with the rounds' range beside it, so a reader
sees how far the rounds of a shared host disagree. Latencies of one round are
nearest-rank percentiles over its callers (:mod:`djcachebench.bench.stats`).
The computation time is printed as the floor: no caller can get a value that
had to be computed in less, so p99 ÷ compute says how many computations' worth
of time the slowest callers waited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from djcachebench.bench.stampede.data import Round, Row, Spread, StampedeResults
from djcachebench.bench.stats import format_ns

COLUMNS = ("backend", "get_or_set", "computations", "wall", "client p50", "client p99",
           "p99 ÷ compute", "max", "cached p99", "wrong values", "status")


def render(data: StampedeResults, charts: Sequence[str] = ()) -> str:
    p, m = data.params, data.machine
    compute = float(p["compute_s"])
    rounds = f"{p['repeat']} rounds per row, interleaved; medians (range)" if p["repeat"] > 1 \
        else "1 round per row"
    lines = [
        "# djcachebench stampede: one absent key, many callers at once",
        "",
        f"{p['procs']} processes x {p['threads']} threads = {p['callers']} callers call "
        f"`cache.get_or_set` on one key that was just deleted, all at one announced "
        f"instant (the release); one computation takes {_time(compute)} (the floor). {rounds}. "
        f"{m.get('cpu_model')}, {m.get('usable_cpus')} usable CPU core(s), "
        f"{m.get('python')}, Django {m.get('django')}.",
        "",
        f"Command: `{' '.join(data.command)}`",
        "",
    ]
    lines += [f"> Warning: {w}" for w in data.warnings]
    if data.warnings:
        lines.append("")
    if data.rows:
        lines += ["| " + " | ".join(COLUMNS) + " |",
                  "|---|---|" + "---:|" * (len(COLUMNS) - 2)]
        for row in data.rows:
            lines.append("| " + " | ".join(_cells(row, compute)) + " |")
        lines += [f"- **{row.name} FAILED:** {'; '.join(row.failures())}"
                  for row in data.rows if row.failures()]
        lines += ["", *_reading(compute)]
        lines += ["", "Every round, per row (computations, client p99, and how late after "
                  "the release the scheduler ran the last caller):", ""]
        for row in data.rows:
            per_round = "; ".join(f"{r.computations}, {_maybe_time(r.p99_s)}, last start "
                                  f"+{_time(r.wakeup_s)}" for r in row.runs)
            lines.append(f"- {row.name}: {per_round}")
        odd = [(row, r) for row in data.rows for r in row.runs if r.cached_computations
               or r.errors]
        for row, r in odd:
            raised = ", ".join(f"{k} x{v}" for k, v in sorted(r.errors.items()))
            lines.append(f"- note: {row.name}: {r.cached_computations} computation(s) in the "
                         f"cached burst; calls that raised: {raised or 'none'}")
    else:
        lines.append("No backend ran.")
    if charts:
        lines += [""] + [f"![{c}]({c})" for c in charts]
    if data.skipped:
        lines += ["", "## Not run", ""]
        lines += [f"- {s['name']} ({s['status']}): {s['reason']}" for s in data.skipped]
    return "\n".join(lines) + "\n"


def _cells(row: Row, compute: float) -> list[str]:
    how = "own (lease)" if row.protected else "Django's"
    return [
        row.name, how,
        _spread(row, lambda r: r.computations, lambda v: f"{v:,.0f}"),
        _spread(row, lambda r: r.wall_s, _time),
        _spread(row, lambda r: r.p50_s, _time),
        _spread(row, lambda r: r.p99_s, _time),
        _spread(row, lambda r: None if r.p99_s is None else r.p99_s / compute,
                lambda v: f"{v:.2f}x"),
        _spread(row, lambda r: r.max_s, _time),
        _spread(row, lambda r: r.cached_p99_s, _time),
        f"{sum(r.wrong for r in row.runs)} of {sum(r.callers for r in row.runs):,}",
        "**FAILED**" if row.failures() else "ok",
    ]


def _spread(row: Row, figure: Callable[[Round], float | None],
            fmt: Callable[[float], str]) -> str:
    """``median (low-high)`` over the rounds that have the figure; one value when they
    all agree; a dash when no round has it (no caller got a value: never 0)."""
    s = Spread.present([figure(r) for r in row.runs])
    if s is None:
        return "-"
    if len(row.runs) == 1 or fmt(s.low) == fmt(s.high):
        return fmt(s.median)
    return f"{fmt(s.median)} ({fmt(s.low)}-{fmt(s.high)})"


def _time(seconds: float) -> str:
    return format_ns(seconds * 1e9)


def _maybe_time(seconds: float | None) -> str:
    return "-" if seconds is None else _time(seconds)


def _reading(compute: float) -> list[str]:
    return [
        "How to read it:",
        "",
        "- **computations**: how many times the upstream work ran for the one key (lines "
        "in the round's computation log). 1 is the ideal; Django's `get_or_set` runs it "
        "in every caller that misses before the first value is stored.",
        "- **client p50 / p99 / max**: each caller's time from the release (one instant "
        "for all: every caller asks then, and a caller the scheduler runs late waits for "
        "its core as a request would) to its return. **wall**: the release to the last "
        "return, which is also the max.",
        f"- **p99 ÷ compute**: the p99 as a multiple of one computation ({_time(compute)}), "
        "the least any caller can wait for a value nobody has yet.",
        "- **cached p99**: the same callers call `get_or_set` again once the value is "
        "stored: nothing to compute, so this is what the callers cost the machine by "
        "themselves (with more processes than cores: the scheduler's share of the p99).",
        "- **wrong values**: callers that raised, or got a value no computation of that "
        "round produced. **FAILED** (exit status 1): in some round every caller raised (a "
        "dash for its latencies: no caller got a value), or a caller got such a value.",
        "- `own (lease)`: the backend's protected `get_or_set` (`STAMPEDE_LEASE`, "
        "`djcachebench.stampede`); `Django's`: `BaseCache.get_or_set`, for every other "
        "backend and for ours with `STAMPEDE_LEASE: None`. locmem keeps one store per "
        "process, so even a protected one could not share a value across processes.",
    ]
