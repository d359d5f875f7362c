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
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.stats import ActionStats
from djcachebench.bench.workload import ACTIONS

PERCENTILE_LABELS = ("p50", "p90", "p99", "p99.9", "max")
# Light to dark: a higher percentile reads as a "heavier" bar.
PERCENTILE_COLORS = ("#c6dbef", "#6baed6", "#2171b5", "#08306b", "#d94801")


def missing_matplotlib() -> str | None:
    """Why no chart can be drawn here, or None: matplotlib is in the ``[bench]`` extra.

    Every command that draws asks this first. The chart modules import
    matplotlib only inside their functions, so guarding their *import* with
    ``except ImportError`` never fired: ``cachebench``, ``stampede`` and
    ``http`` crashed after the run, before writing report.md (found by an
    independent attacker on a plain ``pip install djcachebench``).
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
    return written


def _subtitle(results: Results, shown: str = "error bars") -> str:
    run, m = results.run, results.machine
    repeat = run.get("repeat", 1)
    runs = f"; median of {repeat} runs ({shown}: interval)" if repeat > 1 else ""
    return (
        f"{results.scenario['name']} scenario, {run['procs']} processes x {run['ops']:,} ops"
        f"{runs}; {m.get('cpu_model')}, {m.get('usable_cpus')} CPU core(s)"
    )


def _wrapped_subtitle(results: Results, width: int) -> str:
    """The subtitle, with the machine on its own line when it is wider than the chart."""
    subtitle = _subtitle(results)
    if len(subtitle) > width:
        head, _, machine = subtitle.rpartition("; ")
        subtitle = f"{head}\n{machine}"
    return subtitle


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
    for j, (label, color) in enumerate(zip(PERCENTILE_LABELS, PERCENTILE_COLORS, strict=True)):
        xs, heights, low, high = [], [], [], []
        for i, backend in enumerate(backends):
            points = dict(backend.actions[action].latency_points())
            xs.append(i + (j - (n - 1) / 2) * width)
            height = max(points[label], 1) / 1000
            heights.append(height)
            interval = backend.summary().get(f"{action} {label}")
            low.append(height - interval.low / 1000 if interval else 0.0)
            high.append(interval.high / 1000 - height if interval else 0.0)
        values_us += heights + [h + e for h, e in zip(heights, high, strict=True)]
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
    ax.set_xticklabels([b.name for b in backends], rotation=20, ha="right")
    ax.yaxis.set_major_formatter(_duration_us())
    ax.set_ylabel("latency per call (log scale; 1 ms = 1,000 µs)")
    ax.set_xlabel("backend (median value printed above the p50 bar)")
    subtitle = _wrapped_subtitle(results, 95)
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
    colors = plt.get_cmap("tab10")
    values_us: list[float] = []
    for i, backend in enumerate(backends):
        stats = backend.actions[action]
        summary = backend.summary()
        per_run = " a run" if backend.runs else ""
        xs, ys, low, high = [], [], [], []
        for (q, _), (x, us) in zip(stats.percentile_points(), distribution(stats), strict=True):
            xs.append(x)
            ys.append(us)
            interval = summary.get(f"{action} {_label(q)}")
            low.append(interval.low / 1000 if interval else ys[-1])
            high.append(interval.high / 1000 if interval else ys[-1])
        color = colors(i % 10)
        ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], color=color, linewidth=1.6,
                markersize=5, label=f"{backend.name} ({stats.count:,} calls{per_run})")  # fmt: skip
        if backend.runs:
            ax.fill_between(xs, low, high, color=color, alpha=0.15, linewidth=0)
        values_us += ys + low + high
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
        "percentile (axis: 1/(1 - q), log scale: each step is ten times rarer)\n"
        "beyond 1 - 1/(calls), a percentile is the backend's maximum",
        fontsize=9,
    )
    ax.set_title(f"{action}: latency by percentile\n{_subtitle(results, 'bands')}", fontsize=11)
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
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def _label(q: float) -> str:
    """50.0 -> 'p50', 99.9 -> 'p99.9' (the summary's figure names)."""
    return f"p{q:g}"


def _no_ticks() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def plot_throughput(results: Results, path: Path) -> Path:
    """Horizontal bars of ops/s per backend (all processes together), values printed."""
    plt = _pyplot()
    backends = list(results.backends)
    fig, ax = plt.subplots(figsize=(9.0, 1.0 + 0.55 * len(backends) + 1.2))
    names = [b.name for b in backends][::-1]
    rates = [b.ops_per_s for b in backends][::-1]
    bars = ax.barh(names, rates, color="#2171b5")
    intervals = [b.summary().get("ops/s") for b in backends][::-1]
    top = max([*rates, *[iv.high for iv in intervals if iv]] or [1.0])
    if any(intervals):
        ax.errorbar(
            rates,
            range(len(rates)),
            xerr=[[r - iv.low if iv else 0 for r, iv in zip(rates, intervals, strict=True)],
                  [iv.high - r if iv else 0 for r, iv in zip(rates, intervals, strict=True)]],
            fmt="none", ecolor="#444444", elinewidth=0.9, capsize=3,
        )  # fmt: skip
    for bar, rate, interval, backend in zip(bars, rates, intervals, backends[::-1], strict=True):
        mark = throughput_mark(backend)
        if backend.failures:
            # A failed target's bar is no result: hatched and grey, and it says so.
            bar.set_facecolor("#d9d9d9")
            bar.set_edgecolor("#b2182b")
            bar.set_hatch("//")
        ax.text(
            max(rate, interval.high if interval else rate) + top * 0.01,
            bar.get_y() + bar.get_height() / 2,
            f"{rate:,.0f}" + (f"  {mark}" if mark else ""),
            va="center",
            fontsize=8,
            color="#b2182b" if mark else "black",
        )
    marked = any(throughput_mark(b) for b in backends)
    ax.set_xlim(0, top * (1.6 if marked else 1.18))
    ax.xaxis.set_major_formatter(_thousands())
    ax.set_xlabel(
        "throughput (operations per second, all worker processes together)"
        # Two lines: on one, the note ran past the figure's right edge.
        + ("\nhatched: FAILED (every call of an action raised, or wrong values): not a result"
           "\ncalls that raised are not counted in ops/s; calls the cache gave up on are, as done"
           if marked else "")
    )
    ax.set_title(f"Throughput by backend\n{_wrapped_subtitle(results, 80)}", fontsize=11)
    ax.grid(axis="x", alpha=0.35)
    ax.set_axisbelow(True)
    return _finish(fig, results, path)


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
    if us >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.3g} µs"
