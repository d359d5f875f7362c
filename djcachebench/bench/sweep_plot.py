"""``sweep.png``: throughput, p50 and p99 against the swept parameter, one line per backend.

Drawn from ``sweep.json`` only. The parameter axis is logarithmic (sweeps
double: 1, 2, 4, 8 processes; 1k, 10k, 100k keys) with the values themselves
as ticks; latencies on a log axis (backends span orders of magnitude), the
throughput on a linear one starting at zero so ratios read true. With
repeated runs each point is the median and carries its interval as an error bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from djcachebench.bench.chart_style import series_style
from djcachebench.bench.plot import _duration_us, _pyplot, _thousands
from djcachebench.bench.sweep_results import Sweep


def plot_sweep(sweep: Sweep, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.6))
    action = sweep.action
    panels = (
        (axes[0], "ops/s", "throughput (ops/s, all processes)"),
        (axes[1], f"{action} p50", f"{action} p50 latency (log)"),
        (axes[2], f"{action} p99", f"{action} p99 latency (log)"),
    )
    for i, name in enumerate(sweep.backends()):
        style = series_style(i)
        color, marker = style.color, style.marker
        for ax, figure, _title in panels:
            xs, ys, low, high = [], [], [], []
            for value, results in zip(sweep.values, sweep.points, strict=True):
                backend = next((b for b in results.backends if b.name == name), None)
                if backend is None or backend.failures:
                    continue  # a failed point is no result: left out, named below
                y = _figure(backend, figure)
                if y is None:
                    continue
                interval = backend.summary().get(figure)
                scale = 1.0 if figure == "ops/s" else 1000.0
                xs.append(value)
                ys.append(y)
                low.append(y - interval.low / scale if interval else 0.0)
                high.append(interval.high / scale - y if interval else 0.0)
            if not xs:
                continue
            ax.errorbar(xs, ys, yerr=[low, high] if any(low + high) else None, color=color,
                        marker=marker, markersize=5, linewidth=1.6, capsize=2,
                        label=name)  # fmt: skip
    for ax, figure, title in panels:
        ax.set_xscale("log")
        ax.set_xticks(sweep.values)
        ax.set_xticklabels([_tick(v) for v in sweep.values])
        ax.minorticks_off()
        ax.set_xlabel(sweep.parameter)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.35)
        if figure == "ops/s":
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_formatter(_thousands())
        else:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_duration_us())
            ax.yaxis.set_minor_formatter(_duration_us(minor=True))
    axes[2].legend(title="backend", loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    first = sweep.points[0]
    run, m = first.run, first.machine
    repeat = run.get("repeat", 1)
    runs = f"; median of {repeat} runs (error bars: interval)" if repeat > 1 else ""
    fixed = "" if sweep.parameter == "procs" else f", {run['procs']} processes"
    fig.suptitle(
        f"Sweep of {sweep.parameter}: {first.scenario['name']} scenario{fixed}, "
        f"{run['ops']:,} ops per process{runs}\n{m.get('cpu_model')}, "
        f"{m.get('usable_cpus')} CPU core(s): processes beyond that share cores",
        fontsize=11,
    )
    skipped = sorted({f"{s.name} ({s.reason})" for r in sweep.points for s in r.skipped})
    skipped += [f"{b.name} at {value:,} (FAILED: {'; '.join(b.failures)})"
                for value, r in zip(sweep.values, sweep.points, strict=True)
                for b in r.backends if b.failures]  # fmt: skip
    if skipped:
        fig.text(0.01, 0.01, "Not run: " + "; ".join(skipped)[:300], fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03 if skipped else 0, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _figure(backend: Any, figure: str) -> float | None:
    if figure == "ops/s":
        return float(backend.ops_per_s)
    action, _, label = figure.partition(" ")
    stats = backend.actions.get(action)
    if stats is None or not stats.count:
        return None
    return max(getattr(stats, label), 1) / 1000.0


def _tick(value: int) -> str:
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{unit}"
    return f"{value:,}"
