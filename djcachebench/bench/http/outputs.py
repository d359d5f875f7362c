"""What ``djcachebench http`` writes: the report, and the charts when matplotlib is here.

Apart from ``report.py`` (the tables) and ``charts.py`` (which reads the same
medians the tables do): each of those imports neither this nor the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from djcachebench.bench.http.report import render
from djcachebench.bench.plot import missing_matplotlib

__all__ = ["write_outputs"]


def write_outputs(out: Path, data: dict[str, Any], plot: bool = True) -> list[Path]:
    report = out / "report.md"
    report.write_text(render(data))
    written = [out / "results.json", report]
    # Under --l2-outage the routes' figures are its windows', in report.md only.
    loaded = any(run["routes"] for b in data["backends"].values() for run in b["runs"])
    if plot and loaded and not data.get("routes_skipped"):
        missing = missing_matplotlib()
        if missing:
            print(f"charts skipped: {missing}")
        else:
            from djcachebench.bench.http.charts import draw

            written += draw(out, data)
    return written
