"""A plain timed loop of the harness's own calls: the cross-check of its figures.

The harness's worker (worker.py) does a good deal besides the timed calls:
it keeps every op's clock reads and answer, checks values, publishes its
progress, reads the cache's own counters. None of it is inside the timed
brackets, but an instrument can still change what it measures: a call made
outside the brackets can change how the target behaves inside them (a
``stats()`` that switches a backend's statistics on makes every later get a
write), and work around each call can slow the call itself. A loop that
does nothing but the calls cannot do either, so where the two disagree the
harness is measuring something nobody runs.

**The loop** (:func:`plain_samples`): the same Django settings the harness
gives the target's workers, the same set-up (its management commands,
``clear``, a pre-fill of the same keys and values with ``set_many``), the
same op lists (``generate_ops``: same keys, values and order per worker),
the same start (every process waits at a barrier), the same warm-up; then
each measured call bracketed by ``time.perf_counter_ns()`` and nothing else
kept. An incr of an absent key is followed by ``set(key, 1)`` inside its
bracket, as the harness does. A call that raises is left out of the
latencies, as the harness does.

**The comparison** (:func:`cross_check`): per round, the harness's run
(``run_targets``, one target) and the loop's, in alternating order (harness
first in even rounds, loop first in odd ones), target by target, so that a
slow period of a shared machine lands on both; per figure, the median over
the rounds, and their agreement as the median of each round's ratio.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from djcachebench.bench.orphans import run_orphan_safe
from djcachebench.bench.progress import Progress
from djcachebench.bench.runner import RunOptions, ServerPool, run_targets, stop_processes
from djcachebench.bench.stats import percentile
from djcachebench.bench.targets import Target, TargetEnv
from djcachebench.bench.worker import key_limit, simulated_host
from djcachebench.bench.workload import (
    ACTIONS,
    DELETE,
    GET,
    SET,
    Scenario,
    batches,
    generate_ops,
    prefill_items,
)

#: The figures compared, per action.
FIGURES = ("p50", "p90", "p99")
#: Seconds a loop process may take for its set-up and its ops.
LOOP_TIMEOUT = 600.0


def _loop_process(
    settings: dict[str, Any],
    setup_commands: tuple[str, ...],
    scenario: dict[str, Any],
    seed: int,
    index: int,
    barrier: Any,
    out_path: str,
) -> None:
    """One process of the plain loop; writes ``{action: latencies bytes}`` to ``out_path``."""
    import django
    from django.conf import settings as django_settings

    values = simulated_host(dict(settings), index)
    values.setdefault("SECRET_KEY", "djcachebench-benchmark-not-secret")
    values.setdefault("USE_TZ", True)
    django_settings.configure(**values)
    django.setup()
    from django.core.cache import caches
    from django.core.management import call_command

    cache = caches["default"]
    work = Scenario.from_dict(scenario)
    if index == 0:
        for command in setup_commands:
            call_command(command, verbosity=0)
        cache.clear()
        if work.prefill:
            limit = key_limit(values["CACHES"]["default"])
            cap = None if limit is None else 2 * limit
            for batch in batches(prefill_items(work, seed, cap)):
                cache.set_many(batch)
    ops = generate_ops(work, seed, index)
    barrier.wait(LOOP_TIMEOUT)
    get, set_, delete, incr = cache.get, cache.set, cache.delete, cache.incr
    for code, key, value in ops[: work.warmup]:
        try:
            if code == GET:
                get(key)
            elif code == SET:
                set_(key, value)
            elif code == DELETE:
                delete(key)
            else:
                try:
                    incr(key)
                except ValueError:
                    set_(key, 1)
        except Exception:
            pass
    lat: list[array[int]] = [array("q") for _ in ACTIONS]
    clock = time.perf_counter_ns
    for code, key, value in ops[work.warmup :]:
        try:
            if code == GET:
                t0 = clock()
                get(key)
                t1 = clock()
            elif code == SET:
                t0 = clock()
                set_(key, value)
                t1 = clock()
            elif code == DELETE:
                t0 = clock()
                delete(key)
                t1 = clock()
            else:
                t0 = clock()
                try:
                    incr(key)
                except ValueError:
                    set_(key, 1)
                t1 = clock()
        except Exception:
            continue
        lat[code].append(t1 - t0)
    out = {action: lat[i].tobytes() for i, action in enumerate(ACTIONS)}
    Path(out_path).write_bytes(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    cache.close()


def plain_samples(
    target: Target, pool: ServerPool, scenario: Scenario, seed: int = 0
) -> dict[str, list[int]]:
    """Every process's measured latencies (ns) per action, sorted, of one plain-loop run.

    ``pool`` must already run the target's servers (``pool.need(target)``).
    Raises RuntimeError when a process fails or does not finish in time.
    """
    ctx = mp.get_context("spawn")
    workdir = Path(tempfile.mkdtemp(prefix=f"djcb-plain-{target.name}-"))
    processes: list[Any] = []
    try:
        env = TargetEnv(workdir, pool.locations(), scenario.entry_limit())
        settings = target.django_settings(env)
        barrier = ctx.Barrier(scenario.procs)
        paths = [str(workdir / f"plain-{i}.pickle") for i in range(scenario.procs)]
        processes = [
            ctx.Process(
                # Dies with this process, even a SIGKILLed one, as the harness's workers do.
                target=run_orphan_safe,
                args=(os.getpid(), _loop_process, settings, target.setup_commands,
                      scenario.to_dict(), seed, i, barrier, paths[i]),
                name=f"djcb-plain-{target.name}-{i}",
                daemon=True,
            )
            for i in range(scenario.procs)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + LOOP_TIMEOUT
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        failed = [p.name for p in processes if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"plain loop of {target.name}: {', '.join(failed)} failed")
        merged: dict[str, list[int]] = {action: [] for action in ACTIONS}
        for path in paths:
            part = pickle.loads(Path(path).read_bytes())  # our own processes' files
            for action, raw in part.items():
                values: array[int] = array("q")
                values.frombytes(raw)
                merged[action].extend(values)
        return {action: sorted(values) for action, values in merged.items()}
    finally:
        stop_processes(processes)
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class CrossCheck:
    """One target's figures, per round: ``{"harness"|"plain": {action: {figure: ns}}}``."""

    target: str
    rounds: list[dict[str, dict[str, dict[str, int]]]] = field(default_factory=list)

    def median(self, side: str, action: str, figure: str) -> int | None:
        """The median over the rounds (nearest rank) of one figure, None if a round lacks it."""
        values = [r[side].get(action, {}).get(figure) for r in self.rounds]
        if not values or any(v is None for v in values):
            return None
        return int(percentile(sorted(v for v in values if v is not None), 50))

    def ratio(self, action: str, figure: str = "p50") -> float | None:
        """The median over the rounds of the harness's figure over the loop's (1.0: agree).

        Paired by round: the two runs of a round are next to each other in
        time, so the load of a shared machine, which drifts between rounds,
        divides out of each round's ratio.
        """
        ratios = []
        for sides in self.rounds:
            harness = sides["harness"].get(action, {}).get(figure)
            plain = sides["plain"].get(action, {}).get(figure)
            if harness is None or not plain:
                return None
            ratios.append(harness / plain)
        return float(percentile(sorted(ratios), 50)) if ratios else None


def _figures(samples: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    return {
        action: {name: int(percentile(values, float(name[1:]))) for name in FIGURES}
        for action, values in samples.items()
        if values
    }


def _harness_figures(target: Target, pool: ServerPool, options: RunOptions) -> dict[str, Any]:
    results = run_targets([target], options, Progress(io.StringIO()), servers=pool)
    if not results.backends:
        reasons = "; ".join(s.reason for s in results.skipped)
        raise RuntimeError(f"harness run of {target.name} did not complete: {reasons}")
    actions = results.backends[0].actions
    return {
        action: {name: getattr(stats, name) for name in FIGURES}
        for action, stats in actions.items()
        if stats.count
    }


def cross_check(
    targets: Sequence[Target],
    scenario: Scenario,
    rounds: int = 3,
    seed: int = 0,
    pool: ServerPool | None = None,
) -> tuple[list[CrossCheck], dict[str, str]]:
    """Harness and plain loop, interleaved per round, for every target that can run here.

    Returns the checks and ``{target: reason}`` of those that could not run
    (a missing module, a server that will not start).
    """
    own_pool = pool is None
    pool = pool or ServerPool()
    options = RunOptions(scenario=scenario, seed=seed, command=["cross_check"])
    checks: list[CrossCheck] = []
    skipped: dict[str, str] = {}
    try:
        runnable = []
        for target in targets:
            reason = target.unsupported or target.missing_module() or pool.need(target)
            if reason:
                skipped[target.name] = reason
            else:
                runnable.append(target)
                checks.append(CrossCheck(target.name))
        for index in range(rounds):
            for target, check in zip(runnable, checks, strict=True):
                sides: dict[str, dict[str, dict[str, int]]] = {}
                order = ("harness", "plain") if index % 2 == 0 else ("plain", "harness")
                for side in order:
                    if side == "harness":
                        sides[side] = _harness_figures(target, pool, options)
                    else:
                        sides[side] = _figures(plain_samples(target, pool, scenario, seed))
                check.rounds.append(sides)
    finally:
        if own_pool:
            pool.stop()
    return checks, skipped

