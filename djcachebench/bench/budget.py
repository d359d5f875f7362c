"""A time budget per target: how many ops each target runs, from a short calibration.

Why: the targets differ by three orders of magnitude. The reference scenario's
800,000 ops take a second in an in-process dict and many minutes in Django's
file-based or database cache, so a fixed op count makes the first benchmark
anyone runs last as long as its slowest target allows. With a budget, each
target first runs a short calibration (the same processes, workload and
pre-fill, ``CALIBRATION_OPS`` ops per process, no warm-up); its throughput
sets the op count of the measured run so that warm-up and measured ops fit in
the budget, never more than the scenario's own count. A calibration too short to
time (``MIN_CALIBRATION_S``) runs again with more ops.

What it does not do: stop workers at a deadline. Every target's figures are
of a complete, pre-generated op list, checked for wrong and stale answers as
without a budget; only its length differs, and it is recorded per target
(``targets[name]["plan"]`` in results.json, the report's header and table).
A calibration that under-estimates a fast target gives it fewer ops than the
budget would allow (the run ends sooner); one that over-estimates a slow
target makes it outlast its budget (the run is longer than estimated). The
calibration's own figures are not reported as a result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from djcachebench.bench.workload import Scenario

#: Measured ops per process of a calibration: long enough to count a slow
#: target's calls (Django's database cache does a few hundred a second on two
#: cores), short enough to cost it a few seconds.
CALIBRATION_OPS = 300
#: A calibration shorter than this (seconds of its measured ops) is run again,
#: longer: a fast target's few hundred ops take milliseconds, and the workers'
#: start-up skew and the scheduler then make most of its wall time.
MIN_CALIBRATION_S = 1.0
#: Calibrations of one target at most (the first and its longer repeats).
CALIBRATION_ROUNDS = 3
#: The fewest measured ops per process a budget leaves a target.
MIN_OPS = 200
#: The largest share of a budget given to the warm-up when the budget cuts a target.
WARMUP_SHARE = 0.2
#: Seconds of one target beside its budget, for the estimate printed at the
#: start: two start-ups of the workers (calibration, then the run; each spawns
#: the processes, sets Django up and pre-fills), the calibration's ops, and the
#: count of the entries at the end. A rough figure, said to be one.
OVERHEAD_S = 14.0


@dataclass(frozen=True)
class Plan:
    """What a budget gave one target: its ops per process and why."""

    budget_s: float
    #: The calibration's throughput, all processes together.
    calibration_ops_per_s: float
    #: Measured and warm-up ops per process the target runs.
    ops: int
    warmup: int
    #: The scenario's own counts, run when the budget allows them.
    scenario_ops: int
    scenario_warmup: int

    @property
    def cut(self) -> bool:
        """The budget shortened this target's run below the scenario's."""
        return self.ops < self.scenario_ops or self.warmup < self.scenario_warmup

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cut": self.cut}


def calibration_scenario(scenario: Scenario) -> Scenario:
    """The scenario's processes, keys and mix with few ops and no warm-up."""
    return scenario.with_overrides(ops=min(CALIBRATION_OPS, scenario.ops), warmup=0)


def longer_calibration(scenario: Scenario, calibration: Scenario,
                       wall_s: float) -> Scenario | None:
    """The calibration to run next when ``calibration`` took ``wall_s`` seconds:
    one long enough to time (about twice ``MIN_CALIBRATION_S`` at the rate
    seen, never more ops than the scenario's), or None when this one was long
    enough or already ran the scenario's own count."""
    if wall_s >= MIN_CALIBRATION_S or calibration.ops >= scenario.ops:
        return None
    wanted = math.ceil(calibration.ops * 2 * MIN_CALIBRATION_S / max(wall_s, 0.01))
    return calibration.with_overrides(ops=min(scenario.ops, max(wanted, calibration.ops * 2)))


def plan_ops(scenario: Scenario, ops_per_s: float, budget_s: float) -> Plan:
    """The ops per process that fit warm-up and measured ops into ``budget_s``.

    ``ops_per_s`` is the calibration's rate over all processes; each process is
    taken to do its share. Never more than the scenario's counts; never fewer
    than ``MIN_OPS`` measured ops (a slower target outlasts its budget instead
    of running a sample too small to report).
    """
    per_process = math.floor(budget_s * ops_per_s / scenario.procs) if ops_per_s > 0 else 0
    if per_process >= scenario.ops + scenario.warmup:
        ops, warmup = scenario.ops, scenario.warmup
    else:
        warmup = min(scenario.warmup, math.floor(per_process * WARMUP_SHARE))
        ops = min(scenario.ops, max(MIN_OPS, per_process - warmup))
    return Plan(budget_s, ops_per_s, ops, warmup, scenario.ops, scenario.warmup)


def estimate_s(targets: int, budget_s: float | None, repeat: int = 1) -> float | None:
    """Rough seconds for ``targets`` targets under a budget (None without one: the
    scenario's op count on an unknown target has no estimate)."""
    if budget_s is None:
        return None
    return targets * repeat * (budget_s + OVERHEAD_S)


def describe_estimate(targets: int, budget_s: float | None, repeat: int = 1) -> str:
    """The line printed at the start of a run."""
    seconds = estimate_s(targets, budget_s, repeat)
    if seconds is None:
        return (
            "no time budget: every target runs the scenario's full op count "
            "(the slowest take many minutes each; --budget SECONDS bounds them)"
        )
    runs = f" x {repeat} runs" if repeat > 1 else ""
    return (
        f"time budget {budget_s:g} s of ops per target: estimated {seconds / 60:.0f} min for "
        f"{targets} target(s){runs} (a budget each, plus ~{OVERHEAD_S:g} s of start-up and "
        f"calibration; a loaded machine takes longer)"
    )
