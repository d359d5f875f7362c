"""stampede.png: upstream computations and client p99 per row, from the results file.

Two panels of horizontal bars sharing the row labels (long names such as
``tiered (unprotected)`` read better on a y axis than slanted under bars).
Computations on a log axis: 1 against 100 is the point, and a linear axis
would draw the protected rows as nothing. The p99 panel draws the
computation time as a dashed line (the floor) and the cached burst's p99 as
a tick, so each bar reads as "floor + waiting + the scheduler's share"; its
axis is linear from 0 (the bars are all at least one computation long, and
their differences are the finding), logarithmic only when the bars span more
than ten times. Bars are
the median round, error bars the rounds' range.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from djcachebench.bench.stampede.data import Round, Row, Spread, StampedeResults

PROTECTED = "#238b45"
UNPROTECTED = "#d94801"
OTHER = "#6baed6"


def draw(data: StampedeResults, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # A failed row has no latency to draw (report.md names it): first row at the top.
    rows = [row for row in reversed(data.rows) if not row.failures()]
    if not rows:
        rows = list(reversed(data.rows))
    p, m = data.params, data.machine
    compute_ms = float(p["compute_s"]) * 1e3
    fig, (left, right) = plt.subplots(1, 2, sharey=True,
                                      figsize=(12.0, 1.6 + 0.5 * len(rows) + 1.0))
    colors = [_color(row) for row in rows]
    ys = list(range(len(rows)))

    comp = _bars(left, rows, ys, colors, lambda r: float(max(r.computations, 1)))
    left.set_xscale("log")
    left.set_xlim(0.7, max(s.high for s in comp) * 3)
    left.xaxis.set_major_formatter(_plain())
    _labels(left, comp, lambda v: f"{v:,.0f}")
    left.set_xlabel("upstream computations for the one key (log scale; 1 is ideal)")
    left.set_yticks(ys)
    left.set_yticklabels([row.name for row in rows])

    p99 = _bars(right, rows, ys, colors, lambda r: (r.p99_s or 0.0) * 1e3)
    # The scale follows the bars and the floor; a cached tick far below them sits
    # at the axis' left end rather than squeezing every bar into one decade.
    high = max([s.high for s in p99] + [compute_ms])
    low = min([s.low for s in p99] + [compute_ms])
    start = 0.0
    if high / max(low, 1e-3) > 10:
        right.set_xscale("log")
        start = low / 1.5
    right.set_xlim(start, high * (2.5 if start else 1.3))
    cached = [max(start, _median_ms([r.cached_p99_s for r in row.runs])) for row in rows]
    right.plot(cached, ys, linestyle="none", marker="|", markersize=14, color="#252525",
               label="cached burst p99 (no computation)")
    right.axvline(compute_ms, color="#252525", linestyle="--", linewidth=1,
                  label=f"one computation ({compute_ms:g} ms): the floor")
    right.xaxis.set_major_formatter(_plain())
    _labels(right, p99, lambda v: f"{v:,.0f} ms")
    right.set_xlabel("client p99, ms (each caller: the release to its return)")
    for ax in (left, right):
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.set_axisbelow(True)
    handles, _ = right.get_legend_handles_labels()
    handles += [Patch(color=PROTECTED, label="own get_or_set (lease)"),
                Patch(color=UNPROTECTED, label="ours, lease off (Django's)"),
                Patch(color=OTHER, label="Django's get_or_set")]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    runs = f"median of {p['repeat']} rounds (error bars: range)" if p["repeat"] > 1 \
        else "1 round"
    fig.suptitle(
        f"Stampede: {p['callers']} callers ({p['procs']} processes x {p['threads']} threads) "
        f"ask for one absent key; computation {compute_ms:g} ms\n{runs}; "
        f"{m.get('cpu_model')}, {m.get('usable_cpus')} CPU core(s)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _median_ms(values: list[float | None]) -> float:
    spread = Spread.present(values)
    return 0.0 if spread is None else spread.median * 1e3


def _color(row: Row) -> str:
    if row.protected:
        return PROTECTED
    return UNPROTECTED if row.lease_s is None and row.name.endswith("(unprotected)") else OTHER


def _bars(ax: Any, rows: list[Row], ys: list[int], colors: list[str],
          figure: Callable[[Round], float]) -> list[Spread]:
    spreads = [Spread.of([figure(r) for r in row.runs]) for row in rows]
    medians = [s.median for s in spreads]
    ax.barh(ys, medians, color=colors, height=0.6)
    if any(s.high > s.low for s in spreads):  # no zero-width bars to mistake for ticks
        ax.errorbar(medians, ys, xerr=[[s.median - s.low for s in spreads],
                                       [s.high - s.median for s in spreads]],
                    fmt="none", ecolor="#444444", elinewidth=0.9, capsize=3)
    return spreads


def _labels(ax: Any, spreads: list[Spread], fmt: Callable[[float], str]) -> None:
    """The median printed right of each bar (past its error bar)."""
    for y, s in enumerate(spreads):
        ax.annotate(fmt(s.median), (s.high, y), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=8)


def _plain() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")
