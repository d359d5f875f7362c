"""Charts (matplotlib PNG), drawn from ``results.json`` only.

One chart per action (``get.png``, ``set.png``, ``delete.png``, ``incr.png``):
for every backend, grouped bars at p50, p90, p99, p99.9 and max, on a log axis
in microseconds. Log because the backends span three or more orders of
magnitude (an in-process dict vs a database commit) and a linear axis would
flatten all but the slowest; the axis limits are taken from the data, so no
bar is cut off for being large. Plus ``throughput.png``: ops/s per backend.

Beside each bar chart, ``ACTION-percentiles.png``: the latency distribution,
HdrHistogram style: latency against percentile with x = 1/(1 - q) on a log
axis, so p50, p90, p99, p99.9 and p99.99 are evenly spaced and the tail gets
as much room as the median; one line per backend. Bars compare backends at a
few points; the lines show where each one's tail leaves its median.

With repeated runs every figure is the median of the runs, the bars carry
the confidence interval as an error bar and the lines a shaded band.

What a sample cannot support is not drawn: a percentile p needs at least
10/(1 - p) calls (stats.supported), so six delete calls draw a median and a
max, not a p90 and p99 equal to the max. ``hit-rate.png`` shows the gets that
found a value. A cache private to each process (LocMemCache) is marked in
every legend and label, dashed or hatched, and the throughput axis is scaled
to the shared caches: its bar, which measures another thing, is cut at the
axis's edge with its value printed rather than squashing every other bar.

The ``Agg`` backend is selected explicitly: the harness runs headless (CI,
ssh) and must never try to open a window.
"""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path
from typing import Any

from djcachebench.bench.argtypes import prepare_out_dir
from djcachebench.bench.cache_stats import failure_counts
from djcachebench.bench.chart_style import PER_PROCESS_HATCH, series_style
from djcachebench.bench.formats import PER_PROCESS, describe_ops
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.stats import ActionStats, min_samples, supported
from djcachebench.bench.workload import ACTIONS

PERCENTILE_LABELS = ("p50", "p90", "p99", "p99.9", "max")
#: The percentile each bar label stands for (max: always supported).
LABEL_Q = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99.9": 99.9, "max": 100.0}
# Light to dark: a higher percentile reads as a "heavier" bar.
PERCENTILE_COLORS = ("#c6dbef", "#6baed6", "#2171b5", "#08306b", "#d94801")


def missing_matplotlib() -> str | None:
    """Why no chart can be drawn here, or None: matplotlib is in the ``[bench]`` extra.

    Every command that draws asks this first. The chart modules import
    matplotlib only inside their functions, so guarding their *import* with
    ``except ImportError`` never fires: on a plain ``pip install djcachebench``
    (no charts extra), ``cachebench``, ``stampede`` and ``http`` would crash
    after the run, before writing report.md.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return f"{exc} (pip install 'djcachebench[bench]')"
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_results(results_path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw every chart of ``results.json`` into ``out_dir`` (default: beside it)."""
    results_path = Path(results_path)
    results = Results.load(results_path)
    out = prepare_out_dir(Path(out_dir) if out_dir else results_path.parent)
    written: list[Path] = []
    if not results.backends:
        return written
    for action in ACTIONS:
        if any(action in b.actions and b.actions[action].count for b in results.backends):
            written.append(plot_action(results, action, out / f"{action}.png"))
            written.append(plot_percentiles(results, action, out / f"{action}-percentiles.png"))
    written.append(plot_throughput(results, out / "throughput.png"))
    if any(b.actions.get("get") and b.actions["get"].count for b in results.backends):
        written.append(plot_hit_rate(results, out / "hit-rate.png"))
    return written


def _subtitle(results: Results, shown: str = "error bars") -> str:
    run, m = results.run, results.machine
    repeat = run.get("repeat", 1)
    runs = f"; median of {repeat} runs ({shown}: interval)" if repeat > 1 else ""
    return (
        f"{results.scenario['name']} scenario, {describe_ops(results)}"
        f"{runs}; {m.get('cpu_model')}, {m.get('usable_cpus')} CPU core(s)"
    )


def _wrapped_subtitle(results: Results, width: int, shown: str = "error bars") -> str:
    """The subtitle in lines of at most ``width`` characters, broken at its "; "
    (then at spaces). A title is centred on its axes: a line wider than the axes
    runs past the figure's edge and is cut off (on the distribution chart, whose
    legend takes a third of the figure, the subtitle lost its first letters)."""
    lines: list[str] = []
    for part in _subtitle(results, shown).split("; "):
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "; " + part
        else:
            lines += textwrap.wrap(part, width) or [part]
    return "\n".join(lines)


#: Characters of an 11 pt title per inch of axes (measured: about 0.082 in each).
TITLE_CHARS_PER_INCH = 11


def _footnote(results: Results) -> str:
    lines = []
    if results.skipped:
        lines.append("Not run: " + "; ".join(f"{s.name} ({s.reason})" for s in results.skipped))
    lines += [f"Warning: {w}" for w in results.warnings]
    wrapped = [textwrap.fill(line, 120) for line in lines]  # fits the narrowest chart
    return "\n".join(wrapped)


def _finish(fig: Any, results: Results, path: Path) -> Path:
    note = _footnote(results)
    if note:
        lines = note.count("\n") + 1
        fig.text(0.01, 0.01, note, fontsize=7, va="bottom", ha="left", color="#555555")
        # The footnote's height in inches (7 pt lines) as a share of this figure's:
        # a fixed share cut the footnote off on a short chart (throughput.png).
        reserve = (lines * 7 * 1.5 / 72 + 0.08) / fig.get_figheight()
        fig.tight_layout(rect=(0, min(reserve, 0.5), 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_action(results: Results, action: str, path: Path) -> Path:
    """Grouped bars: one group per backend, one bar per percentile, log µs axis."""
    plt = _pyplot()
    backends = [b for b in results.backends if action in b.actions and b.actions[action].count]
    fig, ax = plt.subplots(figsize=(max(8.0, 1.25 * len(backends) + 3), 6.0))
    n = len(PERCENTILE_LABELS)
    width = 0.8 / n
    values_us: list[float] = []
    thin = False
    for j, (label, color) in enumerate(zip(PERCENTILE_LABELS, PERCENTILE_COLORS, strict=True)):
        xs, heights, low, high = [], [], [], []
        for i, backend in enumerate(backends):
            points = dict(backend.actions[action].latency_points())
            if not supported(LABEL_Q[label], backend.actions[action].count):
                thin = True
                continue  # too few calls: the bar would only repeat the max
            xs.append(i + (j - (n - 1) / 2) * width)
            height = max(points[label], 1) / 1000
            heights.append(height)
            interval = backend.summary().get(f"{action} {label}")
            low.append(height - interval.low / 1000 if interval else 0.0)
            high.append(interval.high / 1000 - height if interval else 0.0)
        values_us += heights + [h + e for h, e in zip(heights, high, strict=True)]
        if not xs:
            # No backend has the calls for it: no bars, and no legend entry either
            # (an empty series is listed in matplotlib's default colour, which read
            # as another percentile's).
            continue
        ax.bar(xs, heights, width, label=label, color=color, edgecolor="white", linewidth=0.4)
        if any(low) or any(high):
            ax.errorbar(xs, heights, yerr=[low, high], fmt="none", ecolor="#444444",
                        elinewidth=0.8, capsize=1.5)  # fmt: skip
    for i, backend in enumerate(backends):
        p50 = (backend.actions[action].p50 or 0) / 1000
        interval = backend.summary().get(f"{action} p50")
        top_of_bar = max(p50, interval.high / 1000) if interval else p50
        ax.annotate(
            _fmt_us(p50),
            (i - 2 * width, top_of_bar),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
            rotation=90,
        )
    ax.set_yscale("log")
    # Limits from the data: the largest max and the smallest p50 both fully visible.
    ax.set_ylim(min(values_us) / 2.5, max(values_us) * 2.5)
    ax.set_xticks(range(len(backends)))
    ax.set_xticklabels([_tick(results, b.name) for b in backends], rotation=20, ha="right")
    ax.yaxis.set_major_formatter(_duration_us())
    ax.set_ylabel("latency per call (log scale; 1 ms = 1,000 µs)")
    ax.set_xlabel("backend (median value printed above the p50 bar)"
                  + (f"\n{THIN_NOTE}" if thin else ""))  # fmt: skip
    # The legend and the axis label take about 2.5 in of the figure's width.
    subtitle = _wrapped_subtitle(
        results, int((fig.get_figwidth() - 2.5) * TITLE_CHARS_PER_INCH)
    )
    ax.set_title(f"{action}: latency per call by percentile\n{subtitle}", fontsize=11)
    ax.grid(axis="y", which="major", alpha=0.35)
    ax.grid(axis="y", which="minor", alpha=0.12)
    ax.set_axisbelow(True)
    # Outside the axes, so it can never hide a bar.
    ax.legend(title="percentile", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return _finish(fig, results, path)


def plot_percentiles(results: Results, action: str, path: Path) -> Path:
    """Latency against percentile, x = 1/(1 - q) on a log axis; one line per backend."""
    plt = _pyplot()
    backends = [b for b in results.backends if action in b.actions and b.actions[action].count]
    fig, ax = plt.subplots(figsize=(10.5, 6.0))
    values_us: list[float] = []
    thin = False
    for i, backend in enumerate(results.backends):
        if backend not in backends:
            continue  # its style stays its position in the results, as on every chart
        stats = backend.actions[action]
        summary = backend.summary()
        per_run = " a run" if backend.runs else ""
        own = results.per_process(backend.name)
        xs, ys, low, high = [], [], [], []
        for (q, _), (x, us) in zip(stats.percentile_points(), distribution(stats), strict=True):
            if not supported(q, stats.count):
                thin = True
                continue
            xs.append(x)
            ys.append(us)
            interval = summary.get(f"{action} {_label(q)}")
            low.append(interval.low / 1000 if interval else ys[-1])
            high.append(interval.high / 1000 if interval else ys[-1])
        style = series_style(i, own)
        color = style.color
        mark = f", {PER_PROCESS}" if own else ""
        ax.plot(xs, ys, marker=style.marker, color=color, linestyle=style.linestyle,
                linewidth=1.6, markersize=5,
                label=f"{backend.name} ({stats.count:,} calls{per_run}{mark})")  # fmt: skip
        if backend.runs:
            ax.fill_between(xs, low, high, color=color, alpha=0.15, linewidth=0)
        values_us += ys + low + high
    values_us = values_us or [1.0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [float(1 / (1 - Fraction(str(q)) / 100)) for q in TAIL_PERCENTILES]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"p{_label(q)[1:]}" for q in TAIL_PERCENTILES])
    ax.xaxis.set_minor_locator(_no_ticks())
    ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
    ax.set_ylim(min(values_us) / 1.8, max(values_us) * 1.8)
    ax.yaxis.set_major_formatter(_duration_us())
    ax.set_ylabel("latency per call (log scale)")
    ax.set_xlabel(
        "percentile (axis: 1/(1 - q), log scale: each step is ten times rarer)"
        + (f"\n{THIN_NOTE}" if thin else "")
        + (f"\ndashed: {PER_PROCESS} cache (each worker its own)"
           if any(results.per_process(b.name) for b in backends) else ""),
        fontsize=9,
    )
    # The legend (backend names with their call counts) takes about 3.8 in.
    subtitle = _wrapped_subtitle(
        results, int((fig.get_figwidth() - 3.8) * TITLE_CHARS_PER_INCH), "bands"
    )
    ax.set_title(f"{action}: latency by percentile\n{subtitle}", fontsize=11)
    ax.grid(which="major", alpha=0.35)
    ax.grid(axis="y", which="minor", alpha=0.12)
    ax.legend(title="backend", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return _finish(fig, results, path)


def distribution(stats: ActionStats) -> list[tuple[float, float]]:
    """The distribution chart's points: (1/(1 - q), latency in µs) for p50 ... p99.99."""
    # Exact in fractions (1/(1 - 0.9999) is 10,000, not 9,999.99...), then a float:
    # matplotlib's fill_between cannot take Fractions.
    return [(float(1 / (1 - Fraction(str(q)) / 100)), max(ns, 1) / 1000)
            for q, ns in stats.percentile_points()]  # fmt: skip


#: The percentiles on the distribution chart's axis.
TAIL_PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)
THIN_NOTE = (
    f"not drawn: percentiles with too few calls (p needs 10/(1 - p): "
    f"{min_samples(99):,} for p99, {min_samples(99.9):,} for p99.9)"
)


def _tick(results: Results, name: str) -> str:
    """A backend's axis label: its name, and on a second line whether it is per-process."""
    return f"{name}\n({PER_PROCESS})" if results.per_process(name) else name


def _label(q: float) -> str:
    """50.0 -> 'p50', 99.9 -> 'p99.9' (the summary's figure names)."""
    return f"p{q:g}"


def _no_ticks() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def plot_throughput(results: Results, path: Path) -> Path:
    """Horizontal bars of ops/s per backend (all processes together), values printed.

    The axis is scaled to the caches the processes share: a per-process cache
    (every worker its own dict, none waits for another) is many times faster
    for answering another question, and on a common axis it flattened every
    other bar. Its bar is hatched and, when off the scale, cut at the edge with
    its value printed.
    """
    plt = _pyplot()
    backends = list(results.backends)
    fig, ax = plt.subplots(figsize=(9.0, 1.0 + 0.55 * len(backends) + 1.2))
    names = [_tick(results, b.name).replace("\n", " ") for b in backends][::-1]
    rates = [b.ops_per_s for b in backends][::-1]
    own = [results.per_process(b.name) for b in backends][::-1]
    intervals = [b.summary().get("ops/s") for b in backends][::-1]
    tops = [max(r, iv.high if iv else r) for r, iv in zip(rates, intervals, strict=True)]
    shared = [t for t, o in zip(tops, own, strict=True) if not o]
    top = max(shared or tops or [1.0]) or 1.0
    off_scale = [o and t > top * 1.25 for t, o in zip(tops, own, strict=True)]
    limit = top * 1.25 if any(off_scale) else top
    shown = [min(r, limit) for r in rates]
    bars = ax.barh(names, shown, color="#2171b5")
    if any(intervals):
        ax.errorbar(
            shown,
            range(len(rates)),
            xerr=[[r - iv.low if iv and not cut else 0
                   for r, iv, cut in zip(rates, intervals, off_scale, strict=True)],
                  [iv.high - r if iv and not cut else 0
                   for r, iv, cut in zip(rates, intervals, off_scale, strict=True)]],
            fmt="none", ecolor="#444444", elinewidth=0.9, capsize=3,
        )  # fmt: skip
    rows = zip(bars, rates, intervals, backends[::-1], own, off_scale, strict=True)
    for bar, rate, interval, backend, per_process, cut in rows:
        mark = throughput_mark(backend)
        if backend.failures:
            # A failed target's bar is no result: hatched and grey, and it says so.
            bar.set_facecolor("#d9d9d9")
            bar.set_edgecolor("#b2182b")
            bar.set_hatch("//")
        elif per_process:
            bar.set_facecolor("#c6dbef")
            bar.set_edgecolor("#2171b5")
            bar.set_hatch(PER_PROCESS_HATCH)
        end = min(rate, interval.high if interval else rate)
        text = f"{rate:,.0f}" + (" (off scale)" if cut else "") + (f"  {mark}" if mark else "")
        ax.text(
            (limit if cut else max(end, rate)) + top * 0.01,
            bar.get_y() + bar.get_height() / 2,
            text,
            va="center",
            fontsize=8,
            color="#b2182b" if mark else "black",
        )
    marked = any(throughput_mark(b) for b in backends)
    ax.set_xlim(0, limit * (1.6 if marked or any(off_scale) else 1.18))
    ax.xaxis.set_major_formatter(_thousands())
    notes = []
    if any(own):
        notes.append(f"dotted: {PER_PROCESS} cache, each worker its own (not shared, so not "
                     "comparable)" + ("\nthe axis is scaled to the shared caches"
                                      if any(off_scale) else ""))  # fmt: skip
    # Each note only for what the chart shows: a run whose only mark is a
    # cache's stale answers has no FAILED bar to explain.
    if any(b.failures for b in backends):
        notes.append("hatched grey: FAILED (every call of an action raised, or wrong values): "
                     "not a result")  # fmt: skip
    if marked:
        # Two lines: on one, the note ran past the figure's right edge.
        notes += [
            "in red: calls that raised, answered wrong or stale, or that the cache gave up on",
            "(calls that raised are not counted in ops/s; calls given up on are, as done)",
        ]
    ax.set_xlabel(
        "throughput (operations per second, all worker processes together)"
        + "".join(f"\n{note}" for note in notes)
    )
    ax.set_title(f"Throughput by backend\n{_wrapped_subtitle(results, 90)}", fontsize=11)
    ax.grid(axis="x", alpha=0.35)
    ax.set_axisbelow(True)
    return _finish(fig, results, path)


def plot_hit_rate(results: Results, path: Path) -> Path:
    """Horizontal bars: the share of gets that found a value, per backend.

    Latencies compare only between caches that hit alike (a miss is usually
    faster than a hit), and a per-process cache misses every key another
    process wrote: this chart says which figures compare.
    """
    plt = _pyplot()
    backends = [b for b in results.backends if b.actions.get("get") and b.actions["get"].count]
    fig, ax = plt.subplots(figsize=(9.0, 1.0 + 0.55 * len(backends) + 1.2))
    names = [_tick(results, b.name).replace("\n", " ") for b in backends][::-1]
    rates = [100 * (1 - b.actions["get"].miss / b.actions["get"].count) for b in backends][::-1]
    bars = ax.barh(names, rates, color="#2ca02c")
    for bar, rate, backend in zip(bars, rates, backends[::-1], strict=True):
        if results.per_process(backend.name):
            bar.set_facecolor("#c7e9c0")
            bar.set_edgecolor("#2ca02c")
            bar.set_hatch(PER_PROCESS_HATCH)
        get = backend.actions["get"]
        ax.text(rate + 1, bar.get_y() + bar.get_height() / 2,
                f"{rate:.1f}%  ({get.count - get.miss:,} of {get.count:,} gets)",
                va="center", fontsize=8)  # fmt: skip
    ax.set_xlim(0, 135)
    ax.set_xticks(range(0, 101, 20))
    ax.xaxis.set_major_formatter(_percent())
    own = any(results.per_process(b.name) for b in backends)
    note = f"\ndotted: {PER_PROCESS} cache: each worker misses what the others wrote"
    ax.set_xlabel(
        "get hit rate (gets that returned a value, of all gets that returned)"
        + (note if own else "")
    )
    ax.set_title(f"Hit rate by backend\n{_wrapped_subtitle(results, 90)}", fontsize=11)
    ax.grid(axis="x", alpha=0.35)
    ax.set_axisbelow(True)
    return _finish(fig, results, path)


def _percent() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: f"{x:.0f}%")


def throughput_mark(backend: BackendResult) -> str:
    """What the throughput chart prints beside a bar: FAILED, or the calls that raised,
    answered wrong or stale, or that the cache gave up on."""
    if backend.failures:
        return "FAILED"
    errors = sum(s.errors for s in backend.actions.values())
    wrong = sum(s.wrong for s in backend.actions.values())
    stale = sum(s.stale for s in backend.actions.values())
    counts = failure_counts(backend.cache_stats) or {}
    gave_up = counts.get("give_ups", 0) + counts.get("l2_give_ups", 0)
    silent = f"{gave_up:,} gave up" if gave_up else ("silent failures" if counts else "")
    parts = [f"{errors:,} errors" if errors else "", f"{wrong:,} wrong" if wrong else "",
             f"{stale:,} stale" if stale else "", silent]  # fmt: skip
    return ", ".join(p for p in parts if p)


def _duration_us(minor: bool = False) -> Any:
    """Tick labels in readable units for an axis in µs: 10 µs, 1 ms, 1 s.

    ``minor``: for a log axis's minor ticks, labelling only 2x and 5x of a
    power of ten (in the same units); left to matplotlib, they read "4 x 10^1"
    beside a major "10 µs" on an axis of less than a decade (sweep.png).
    """
    from matplotlib.ticker import FuncFormatter

    def label(us: float, _pos: int) -> str:
        if minor and f"{us:.0e}"[0] not in "25":
            return ""
        if us >= 1_000_000:
            return f"{us / 1_000_000:g} s"
        if us >= 1_000:
            return f"{us / 1_000:g} ms"
        return f"{us:g} µs"

    return FuncFormatter(label)


def _thousands() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: f"{x:,.0f}")


def _fmt_us(us: float) -> str:
    """12.3 µs, 456 µs, 1.02 ms: never an exponent (``.3g`` wrote 999.7 µs as "1e+03")."""
    if us >= 999.5:
        ms = us / 1000
        return f"{ms:.0f} ms" if ms >= 99.95 else f"{ms:.3g} ms"
    return f"{us:.0f} µs" if us >= 99.95 else f"{us:.3g} µs"
