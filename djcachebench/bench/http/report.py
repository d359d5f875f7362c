"""report.md and the charts of ``djcachebench http``, drawn from its results data.

Every figure with ``--repeat`` is the median of the runs (each run's wrk
figures kept as wrk printed them, never merged); the report also gives each
run's requests/s so that a reader sees the spread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from djcachebench.bench.http.outage import KINDS, summarize
from djcachebench.bench.stats import percentile


def median(values: Iterable[float]) -> float:
    """The nearest-rank median (an observed run's value): the project's one percentile."""
    return float(percentile(sorted(values), 50))

#: (cached route, the uncached route it is compared with)
PAIRS = (("light-page", "light"), ("light-lowlevel", "light"),
         ("heavy-page", "heavy"), ("heavy-lowlevel", "heavy"))


def median_route(backend: dict[str, Any], route: str, field: str) -> float | None:
    values = [r["routes"][route][field] for r in backend["runs"] if route in r["routes"]]
    return median(values) if values else None


def ratios(backend: dict[str, Any]) -> dict[str, float]:
    """Cached / uncached requests per second, per cached route."""
    out = {}
    for cached, plain in PAIRS:
        a, b = median_route(backend, cached, "requests_per_s"), median_route(
            backend, plain, "requests_per_s")
        if a is not None and b:
            out[cached] = a / b
    return out


def _sum(backend: dict[str, Any], part: str, field: str) -> int:
    return sum(r[part].get(field, 0) for r in backend["runs"] if part in r)


def render(data: dict[str, Any]) -> str:
    p, m = data["params"], data["machine"]
    backends = data["backends"]
    lines = [
        "# djcachebench http: a Django site under gunicorn",
        "",
        f"{p['workers']} gunicorn sync workers; wrk {p['connections']} connections, "
        f"{p['duration']:g} s per route; {p['repeat']} run(s) interleaved (medians shown); "
        f"{m.get('cpu_model')}, {m.get('usable_cpus')} usable CPU core(s). "
        f"Command: `{' '.join(data['command'])}`",
        "",
    ]
    if data.get("routes_skipped"):
        lines += [f"Routes not loaded: {data['routes_skipped']}", ""]
    routes = [r for r in p["routes"] if any(median_route(b, r, "requests_per_s") is not None
                                            for b in backends.values())]
    if routes:
        lines += ["## Requests per second (wrk)", "",
                  "| route | " + " | ".join(backends) + " |",
                  "|---|" + "---:|" * len(backends)]
        for route in routes:
            cells = []
            for b in backends.values():
                rps = median_route(b, route, "requests_per_s")
                cells.append("" if rps is None else f"{rps:,.0f}")
            lines.append(f"| {route} | " + " | ".join(cells) + " |")
        lines += ["", "## Latency p50 / p90 / p99 / max, ms (wrk's own); non-2xx; socket errors",
                  "", "| backend | route | p50 | p90 | p99 | max | non-2xx | socket errors |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for name, b in backends.items():
            for route in routes:
                if median_route(b, route, "p50_ms") is None:
                    continue
                vals = [median_route(b, route, f) for f in ("p50_ms", "p90_ms", "p99_ms",
                                                             "max_ms")]
                errs = [sum(r["routes"][route][f] for r in b["runs"] if route in r["routes"])
                        for f in ("non_2xx", "socket_errors")]
                lines.append(f"| {name} | {route} | " + " | ".join(f"{v:.2f}" for v in vals)
                             + f" | {errs[0]} | {errs[1]} |")
        lines += ["", "## Cached / uncached requests per second", "",
                  "| backend | " + " | ".join(c for c, _ in PAIRS) + " |",
                  "|---|" + "---:|" * len(PAIRS)]
        for name, b in backends.items():
            r = ratios(b)
            lines.append(f"| {name} | " + " | ".join(
                f"x{r[c]:.1f}" if c in r else "" for c, _ in PAIRS) + " |")
        lines += ["", "Requests/s of every run, per route:", ""]
        for name, b in backends.items():
            per_run = "; ".join(
                f"{route} " + ", ".join(f"{r['routes'][route]['requests_per_s']:,.0f}"
                                        for r in b["runs"] if route in r["routes"])
                for route in routes)
            lines.append(f"- {name}: {per_run}")
    lines += outage_section(data)
    lines += ["", "## Freshness: reads of the cached product list after an invalidating POST",
              "", "| backend | reads checked | stale | errors | unexpected page |",
              "|---|---:|---:|---:|---:|"]
    for name, b in backends.items():
        lines.append(f"| {name} | {_sum(b, 'freshness', 'checked')} | "
                     f"{_sum(b, 'freshness', 'stale')} | {_sum(b, 'freshness', 'errors')} | "
                     f"{_sum(b, 'freshness', 'unexpected')} |")
    lines += ["", f"## Stampede: {p['stampede_clients']} simultaneous requests for one "
              f"uncomputed key, a {p['compute_seconds'] * 1000:.0f} ms computation", "",
              "| backend | get_or_set | computations | wall, ms | client p50, ms | "
              "client p99, ms | cached burst p99, ms | failed | overlapped, per run |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    not_stampedes: list[str] = []
    not_floors: list[str] = []
    for name, b in backends.items():
        for mode in ("protected", "unprotected"):
            runs = [r["stampede"][mode] for r in b["runs"] if "stampede" in r]
            if not runs:
                continue
            med = {f: median(x[f] for x in runs)
                   for f in ("computations", "wall_ms", "p50_ms", "p99_ms")}
            label = "cache.get_or_set" if mode == "protected" else "BaseCache.get_or_set"
            cached = [r["stampede"]["cached"]["p99_ms"] for r in b["runs"]
                      if "cached" in r.get("stampede", {})]
            floor = f"{median(cached):.0f}" if cached and mode == "protected" else "-"
            computed = [r["stampede"]["cached"]["computations"] for r in b["runs"]
                        if "cached" in r.get("stampede", {})]
            if mode == "protected" and any(computed):
                floor += " (computed)"
                not_floors += [f"{name}, run {i + 1}: {n} computation(s)"
                               for i, n in enumerate(computed) if n]
            met = [x.get("overlapped") for x in runs]
            shown = ", ".join("-" if m is None else str(m) for m in met)
            lines.append(f"| {name} | {label} | {med['computations']:g} | {med['wall_ms']:.0f} | "
                         f"{med['p50_ms']:.0f} | {med['p99_ms']:.0f} | {floor} | "
                         f"{sum(x['failures'] for x in runs)} | {shown} |")
            not_stampedes += [f"{name} {label}, run {i + 1}: {m} of {x['clients']}"
                              for i, (x, m) in enumerate(zip(runs, met, strict=True))
                              if m is not None and m < x["clients"] / 2]
    lines += ["", "`cache.get_or_set` is the backend's own: ShardedSQLiteCache and TieredCache "
              "take a lease so that one caller computes; every other backend's is Django's "
              "`BaseCache.get_or_set`, the second row for all of them. The cached burst is "
              "the same simultaneous requests sent again once the value is stored: no "
              "computation to wait for, so its p99 is what this server and client take to "
              "answer that many requests at once, the floor under the stampede's. "
              "Overlapped: requests that reached the view before the round's first "
              "computation ended (all of them in a true stampede; `-`: files written "
              "before this was measured)."]
    if not_floors:
        lines += ["", "The cached burst computed (the value the protected round stored was "
                  "not there for it: a per-process cache, or one that lost it), so its p99 "
                  "includes computations and is no floor: " + "; ".join(not_floors) + "."]
    if not_stampedes:
        lines += ["", "Not a stampede (fewer than half the requests arrived before the first "
                  "computation ended; the server was slow to accept them): "
                  + "; ".join(not_stampedes) + "."]
    if data.get("failed"):
        lines += ["", "## FAILED", ""] + [f"- **{k}**: {v}" for k, v in data["failed"].items()]
    if data["skipped"]:
        lines += ["", "## Not run", ""] + [f"- {k}: {v}" for k, v in data["skipped"].items()]
    return "\n".join(lines) + "\n"


def outage_section(data: dict[str, Any]) -> list[str]:
    """The ``--l2-outage`` table: each route's windows of each kind, over every run."""
    every = data["params"].get("l2_outage")
    backends = {name: b for name, b in data["backends"].items()
                if any(r.get("outage") for r in b["runs"])}
    if not every or not backends:
        return []
    lines = ["", f"## L2 outage: the server stopped {every} s, continued {every} s, "
             "alternately", "",
             "| backend | route | windows | requests/s | 2xx/s | non-2xx | socket errors "
             "| p50, ms | p99, ms |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, b in backends.items():
        routes = [r for r in data["params"]["routes"] if any(r in run.get("outage", {})
                                                            for run in b["runs"])]
        for route in routes:
            windows = [w for run in b["runs"] for w in run.get("outage", {}).get(route, {})
                       .get("windows", [])]
            for kind in KINDS:
                s = summarize(windows, kind)
                if s is None:
                    continue
                p50, p99 = (("-" if s[f] is None else f"{s[f]:,.1f}") for f in ("p50_ms",
                                                                                   "p99_ms"))
                lines.append(f"| {name} | {route} | {kind} ({s['windows']} x {every} s) | "
                             f"{s['requests_per_s']:,.0f} | {s['ok_per_s']:,.0f} | "
                             f"{s['non_2xx']:,} | {s['socket_errors']:,} | {p50} | {p99} |")
    lines += ["", "Each window is one wrk run of its own, over every run: requests/s is the "
              "windows' requests over their seconds, 2xx/s counts only good answers; p50 is "
              "the median of the windows' p50s and p99 the highest window's. Requests still "
              "waiting when a window ends are dropped by wrk, counted neither as served nor "
              "as errors; the site still serves them, in the next window."]
    return lines
