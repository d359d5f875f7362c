"""How the report and the charts write a figure for people: bytes, percentiles the
sample supports, the op counts a budget chose, a cache private to each process.

One place for each, so the tables and the charts say the same thing in the
same words (they read only results.json; see report.py and plot.py).
"""

from __future__ import annotations

from djcachebench.bench.concurrency import lanes_label
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.stats import format_ns, min_samples, supported


def format_bytes(n: float, signed: bool = False) -> str:
    """1,234 B, 12.3 KiB, 1023 KiB, 4.5 MiB: binary units, as the OS reports memory.

    Three significant digits, never an exponent (``.3g`` wrote 1,023 KiB as
    "1.02e+03 KiB"); a value that rounds to 1.00 of the next unit is written in
    it. ``signed``: a change, written with its sign (+12 KiB, -3 KiB).
    """
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale * 0.9995:
            value = n / scale
            return f"{sign}{value:.0f} {unit}" if value >= 99.95 else f"{sign}{value:.3g} {unit}"
    return f"{sign}{n:,.0f} B"


#: Beside a percentile the sample is too small for (stats.supported).
THIN = "*"
PERCENTILE_NOTE = (
    f"{THIN}: too few calls for this percentile: p needs at least 10/(1 - p) calls "
    f"({min_samples(50):,} for the median, {min_samples(90):,} for p90, "
    f"{min_samples(99):,} for p99), else it is one of the few slowest calls, not a tail "
    "estimate (six calls: p90, p99 and max are the same call). Charts leave such "
    "percentiles out."
)


def format_percentile(ns: float | None, q: float, count: int) -> str:
    """A percentile's latency, flagged with THIN when ``count`` calls cannot support it."""
    text = format_ns(ns)
    return text if ns is None or supported(q, count) else text + THIN


def describe_ops(results: Results) -> str:
    """``8 processes x 100,000 ops``, or, under a budget, what sized the op counts."""
    run = results.run
    procs = f"{run['procs']} processes{lanes_label(run)}"
    if run.get("budget_s"):
        return (f"{procs}, ops per target sized by a {run['budget_s']:g} s "
                f"budget (at most {run['ops']:,})")  # fmt: skip
    return f"{procs} x {run['ops']:,} ops"


def ops_per_process(results: Results, backend: BackendResult) -> str:
    """The Summary's Ops/process cell: measured ops per process, and whether a budget cut them."""
    plan = results.plan(backend.name)
    if plan is None:
        return f"{results.run['ops']:,}"
    return f"{plan['ops']:,}" + (" (cut)" if plan.get("cut") else "")


def plan_line(results: Results, backend: BackendResult) -> str | None:
    """A sentence on what the budget gave a target, or None without a budget."""
    plan = results.plan(backend.name)
    if plan is None:
        return None
    ran = f"{plan['ops']:,} measured + {plan['warmup']:,} warm-up ops per process"
    why = (f"cut from the scenario's {plan['scenario_ops']:,} + {plan['scenario_warmup']:,} "
           f"to fit the {plan['budget_s']:g} s budget" if plan.get("cut")
           else "the scenario's full counts, within the budget")  # fmt: skip
    return f"{ran} ({why}; calibration: {plan['calibration_ops_per_s']:,.0f} ops/s)"


#: Beside a cache private to each process, in tables and charts.
PER_PROCESS = "per-process"
PER_PROCESS_NOTE = (
    f"{PER_PROCESS}: every worker process has its own cache (Django's LocMemCache), so it "
    "misses what the other processes wrote and never waits for them: its hit rate and "
    "speed answer another question than a shared cache's."
)


def backend_label(results: Results, name: str) -> str:
    """The backend's name, marked when its cache is private to each process."""
    return f"{name} ({PER_PROCESS})" if results.per_process(name) else name


def ops_phrase(results: Results) -> str:
    """The workload line's op counts: the scenario's, or the budget's per target."""
    run = results.run
    scenario = f"{run['ops']:,} measured ops after {run['warmup']:,} warm-up ops"
    if not run.get("budget_s"):
        return scenario
    return (f"up to the scenario's {scenario}: a {run['budget_s']:g} s budget per target sized "
            "each target's counts from a short calibration (Ops/process in the Summary; cut: "
            "fewer than the scenario's)")  # fmt: skip
