"""The charts of ``djcachebench http``: requests/s and p99 latency per route and backend.

Grouped bars on a log axis: uncached and cached routes differ by one to two
orders of magnitude, and a linear axis would flatten the uncached ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from djcachebench.bench.http.report import median_route


def draw(out: Path, data: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    backends = data["backends"]
    routes = [r for r in data["params"]["routes"]
              if any(median_route(b, r, "requests_per_s") is not None
                     for b in backends.values())]
    m, p = data["machine"], data["params"]
    subtitle = (f"{p['workers']} gunicorn sync workers, wrk {p['connections']} connections, "
                f"{p['duration']:g} s per route, median of {p['repeat']} run(s); "
                f"{m.get('usable_cpus')} CPU core(s)")
    written = []
    for field, name, label in (("requests_per_s", "throughput.png", "requests per second"),
                               ("p99_ms", "latency.png", "p99 latency, ms (wrk)")):
        fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(routes) + 3), 5.5))
        width = 0.8 / max(1, len(backends))
        colors = plt.get_cmap("tab10")
        for i, (backend, b) in enumerate(backends.items()):
            xs, heights = [], []
            for j, route in enumerate(routes):
                value = median_route(b, route, field)
                if value is not None:
                    xs.append(j + (i - (len(backends) - 1) / 2) * width)
                    heights.append(max(value, 1e-3))
            ax.bar(xs, heights, width, label=backend, color=colors(i % 10))
        ax.set_yscale("log")
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 1.8)  # room for the bar labels under the title
        plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain if _few_decades(ax) else NullFormatter())
        for bar_group in ax.containers:
            ax.bar_label(bar_group, fmt="{:,.0f}" if field == "requests_per_s" else "{:,.1f}",
                         fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(routes)))
        ax.set_xticklabels(routes, rotation=20)
        ax.set_ylabel(f"{label} (log scale)")
        ax.set_title(f"djcachebench http: {label} by route\n{subtitle}", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.set_axisbelow(True)
        ax.legend(title="backend", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _few_decades(ax: object) -> bool:
    """Label minor ticks too when the axis spans less than two decades (else
    a log axis may show a single labelled tick)."""
    low, high = ax.get_ylim()  # type: ignore[attr-defined]
    return high / max(low, 1e-9) < 100
