"""How a chart tells its series apart: one colour and one marker per backend.

Sixteen of each, all different, so that a run of up to sixteen targets never
draws two backends alike (matplotlib's ``tab10`` repeats from the eleventh:
the reference run's first and last targets shared a colour). A colour and a
marker together also survive a grey-scale print and colour-blind readers.
Series are styled by their position in the results, so the same target keeps
its style across a run's charts.
"""

from __future__ import annotations

from dataclasses import dataclass

#: tab10, then six more of tab20's and a few distinct darks: sixteen colours, none repeated.
COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#000000",
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d", "H", "8", "1")
#: The line style of a cache private to each process: dashed, so it reads as apart.
PER_PROCESS_LINE = "--"
#: The hatch of a per-process cache's bar.
PER_PROCESS_HATCH = ".."


@dataclass(frozen=True)
class SeriesStyle:
    color: str
    marker: str
    linestyle: str = "-"


def series_style(index: int, per_process: bool = False) -> SeriesStyle:
    """The style of the ``index``-th series; distinct for the first sixteen."""
    return SeriesStyle(
        COLORS[index % len(COLORS)],
        MARKERS[index % len(MARKERS)],
        PER_PROCESS_LINE if per_process else "-",
    )
