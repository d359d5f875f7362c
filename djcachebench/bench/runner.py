"""Orchestration: servers, one target after another, workers, exact merge.

Targets run one at a time on the same machine with the same workload, so
they never compete with each other for the CPU; with ``repeat`` they run
interleaved (A B C, C B A, ...) and each run's figures are kept. A target that cannot run
(missing module, server that will not start) is *skipped*; one that breaks
while running (a worker raises, times out) has *failed*; both are recorded
with the reason and the run goes on with the next target. Servers and
worker processes are stopped in ``finally`` blocks, by PID, so an error or a
Ctrl-C never leaves a memcached, a redis-server or a worker behind; on Linux
they also die with a SIGKILLed harness (orphans.py).

With a time budget (``RunOptions.budget``) each target runs a short calibration
first and then as many ops as fit (budget.py). An interrupt (Ctrl-C, SIGTERM)
raises :class:`RunInterrupted` carrying the results of the targets that
finished, the one cut short marked ``interrupted`` and the rest ``not run``,
so the caller can still write them.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from djcachebench.bench.budget import (
    CALIBRATION_ROUNDS,
    Plan,
    calibration_scenario,
    longer_calibration,
    plan_ops,
)
from djcachebench.bench.footprint import server_memory
from djcachebench.bench.merge import merge_results
from djcachebench.bench.orphans import run_orphan_safe
from djcachebench.bench.progress import Progress
from djcachebench.bench.provenance import server_info
from djcachebench.bench.results import (
    BackendResult,
    Results,
    Skipped,
    machine_info,
    oversubscription_warning,
)
from djcachebench.bench.server_pool import ServerPool
from djcachebench.bench.servers import ServerUnavailable
from djcachebench.bench.signals import deferred_signals, raise_pending, signal_of
from djcachebench.bench.summary import run_order
from djcachebench.bench.targets import (
    Target,
    TargetEnv,
    backend_paths,
    is_per_process,
    resolvable,
)
from djcachebench.bench.worker import WorkerResult, WorkerSpec, worker_main
from djcachebench.bench.workload import Scenario, volume_warning


class TargetFailed(RuntimeError):
    """A target broke while running; the message is the recorded reason.

    ``detail`` carries the worker's full traceback, printed but not recorded.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.detail = detail


@dataclass
class RunOptions:
    """How to run, the same for every target of one run."""

    scenario: Scenario
    seed: int = 0
    start_method: str = "spawn"
    #: Seconds for all workers to be ready (Django set-up, pre-fill, op list);
    #: None: 300 s plus 1 ms per key (a million-key pre-fill through a
    #: client that sends one request per key takes minutes).
    ready_timeout: float | None = None
    #: Seconds for the measured phase of one target before it is declared failed.
    timeout: float = 3600.0
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    #: Runs of every target, interleaved (A B C, C B A, ...); see summary.py.
    repeat: int = 1
    #: Seconds of warm-up and measured ops per target, sized by a calibration
    #: (budget.py); None: every target runs the scenario's counts.
    budget: float | None = None


@dataclass(frozen=True)
class Job:
    """One cache to benchmark, resolved to what the workers are given."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    settings_module: str | None = None
    alias: str = "default"
    setup_commands: tuple[str, ...] = ()
    clear: bool = True
    #: Without ``clear``: delete the workload's own keys before each run instead,
    #: so the values the gets return are still checked (worker.WorkerSpec).
    delete_keys: bool = False
    #: The target's private directory, measured for bytes on disk (footprint.py).
    disk_dir: str | None = None
    #: A cache private to each process (LocMemCache): answers made stale by
    #: other processes' writes are reported, not held against it (freshness.py).
    per_process: bool = False
    #: Seconds after another simulated host's acknowledged write from which the
    #: cache promises to return it or a later value (freshness.Scope).
    host_bound: float = 0.0


def new_results(options: RunOptions) -> Results:
    """An empty Results with the machine, scenario and run settings filled in."""
    scenario = options.scenario
    results = Results(
        machine=machine_info(),
        scenario=scenario.to_dict(),
        run={
            "procs": scenario.procs,
            "threads": scenario.threads,
            "tasks": scenario.tasks,
            "ops": scenario.ops,
            "warmup": scenario.warmup,
            "seed": options.seed,
            "start_method": options.start_method,
            "repeat": options.repeat,
            "budget_s": options.budget,
        },
        command=options.command,
    )
    warning = oversubscription_warning(scenario.procs, results.machine["usable_cpus"])
    if warning:
        results.warnings.append(warning)
    volume = volume_warning(scenario)
    if volume:
        results.warnings.append(volume)
    return results


class TargetSkipped(RuntimeError):
    """A target cannot run here (a BACKEND class is missing); the message is the reason."""


#: A target's run: ``run(label, finished)`` returns its result, and hands it to
#: ``finished`` first, before the line that reports it (see ``run_job``).
Runner = Callable[[str, Callable[[BackendResult], None]], BackendResult]


def run_targets(
    targets: Sequence[Target],
    options: RunOptions,
    progress: Progress | None = None,
    servers: ServerPool | None = None,
) -> Results:
    """Benchmark every target, ``options.repeat`` times interleaved; never raises for one target.

    ``servers``: a pool shared by several calls (a sweep), stopped by its owner;
    without one, the servers of this run are started here and stopped at its end.
    """
    progress = progress or Progress()
    results = new_results(options)
    for warning in results.warnings:
        progress.say(f"WARNING: {warning}")
    pool = servers or ServerPool()
    runnable: list[tuple[str, Runner]] = []
    try:
        for target in targets:
            results.targets[target.name] = {
                "description": target.description,
                "note": target.note,
                "servers": list(target.servers),
                "modules": list(target.modules),
            }
            reason = (target.unsupported or target.too_many_keys(options.scenario.keys)
                      or target.missing_module() or pool.need(target))
            if reason:
                _skip(results, progress, target.name, reason)
                continue
            runnable.append((target.name, _target_runner(target, pool, options, results, progress)))
        _interleave(runnable, options.repeat, results, progress)
        results.machine["servers"] = {k: server_info(s) for k, s in pool.servers.items()}
    except RunInterrupted:
        results.machine["servers"] = {k: server_info(s) for k, s in pool.servers.items()}
        raise
    except KeyboardInterrupt as exc:  # while the servers started: nothing ran yet
        for target in targets:
            if target.name not in {s.name for s in results.skipped}:
                results.skipped.append(Skipped(target.name, NOT_RUN, "not run"))
        raise RunInterrupted(results, signal_of(exc)) from exc
    finally:
        if servers is None:
            pool.stop()
    return results


#: The reason recorded for a target an interrupt kept from starting.
NOT_RUN = "the run was interrupted before this target started"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run: ``results`` holds what finished.

    A KeyboardInterrupt still, so a caller that only cleans up and exits
    (``sweep``, ``cachebench``) behaves as before; ``signum`` tells SIGINT
    from SIGTERM for the exit status (128 + signum).
    """

    def __init__(self, results: Results, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.results = results
        self.signum = signum


def run_jobs(
    jobs: Sequence[tuple[Job, dict[str, Any]]],
    options: RunOptions,
    progress: Progress | None = None,
) -> Results:
    """Benchmark ready-made jobs (the ``cachebench`` management command's aliases).

    Each job comes with the description recorded under ``targets`` in the results.
    """
    progress = progress or Progress()
    results = new_results(options)
    for warning in results.warnings:
        progress.say(f"WARNING: {warning}")
    runnable: list[tuple[str, Runner]] = []
    for job, description in jobs:
        results.targets[job.name] = description
        runnable.append((job.name, _job_runner(job, options, progress)))
    _interleave(runnable, options.repeat, results, progress)
    return results


def _job_runner(
    job: Job, options: RunOptions, progress: Progress
) -> Runner:
    return lambda label, finished: run_job(job, options, progress, label, finished)


def _interleave(
    runnable: Sequence[tuple[str, Runner]],
    repeat: int,
    results: Results,
    progress: Progress,
) -> None:
    """Run each item ``repeat`` times as A B C, C B A, ... (``run_order``); keep
    every run's figures.

    Interleaving spreads a slow period of a shared host over every target
    instead of landing on one target's runs, and reversing every other round
    keeps any one target from always running first. A target that cannot run is
    skipped once; one that fails in any run is recorded as failed and its
    other runs are dropped (a partial set of runs would not compare).
    """
    runs: dict[str, list[BackendResult]] = {name: [] for name, _ in runnable}
    out: set[str] = set()
    current = ""
    try:
        for index in range(repeat):
            for name, run in run_order(runnable, index):
                if name in out:
                    continue
                current = name
                label = name if repeat == 1 else f"{name} (run {index + 1}/{repeat})"
                try:
                    run(label, runs[name].append)
                except TargetSkipped as exc:
                    _skip(results, progress, name, str(exc))
                    out.add(name)
                except TargetFailed as exc:
                    if exc.detail:
                        progress.say(exc.detail)
                    reason = str(exc) if repeat == 1 else f"run {index + 1} of {repeat}: {exc}"
                    _skip(results, progress, name, reason, status="failed")
                    out.add(name)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, RunInterrupted) else signal_of(exc)
        _keep_finished(runnable, runs, out, repeat, current, results, signum)
        raise RunInterrupted(results, signum) from exc
    results.backends += [
        BackendResult.from_runs(runs[name]) for name, _ in runnable if name not in out
    ]


def _keep_finished(
    runnable: Sequence[tuple[str, Runner]],
    runs: dict[str, list[BackendResult]],
    out: set[str],
    repeat: int,
    current: str,
    results: Results,
    signum: int,
) -> None:
    """After an interrupt: the targets with every run done are results; the one
    running is ``interrupted``; the others ``not run`` (a target with only some of
    its runs is not reported: its runs would not be interleaved with the others')."""
    how = signal.Signals(signum).name
    for name, _ in runnable:
        if name in out:
            continue
        done = len(runs[name])
        if done == repeat:
            results.backends.append(BackendResult.from_runs(runs[name]))
        elif name == current:
            runs_done = f" ({done} of {repeat} runs done)" if repeat > 1 else ""
            results.skipped.append(Skipped(name, f"interrupted by {how} while running{runs_done}",
                                           "interrupted"))  # fmt: skip
        else:
            results.skipped.append(Skipped(name, NOT_RUN, "not run"))


def _target_runner(
    target: Target,
    pool: ServerPool,
    options: RunOptions,
    results: Results,
    progress: Progress,
) -> Runner:
    plans: dict[str, Plan] = {}

    def run(label: str, finished: Callable[[BackendResult], None]) -> BackendResult:
        workdir = Path(tempfile.mkdtemp(prefix=f"djcb-{target.name}-"))
        try:
            env = TargetEnv(workdir, pool.locations(), options.scenario.entry_limit())
            settings = target.django_settings(env)
            results.targets[target.name].setdefault("settings", settings)
            for path in backend_paths(settings):
                reason = resolvable(path)
                if reason:
                    raise TargetSkipped(reason)
            job = Job(
                target.name,
                settings=settings,
                setup_commands=target.setup_commands,
                disk_dir=str(workdir),
                per_process=target.per_process or is_per_process(settings["CACHES"]["default"]),
                host_bound=target.host_bound,
            )
            results.targets[target.name]["per_process"] = job.per_process
            run_options = options
            if options.budget is not None:
                if target.name not in plans:  # once per target: its repeats run alike
                    plans[target.name] = _calibrate(target, job, pool, options, progress, label)
                    results.targets[target.name]["plan"] = plans[target.name].to_dict()
                plan = plans[target.name]
                scenario = options.scenario.with_overrides(ops=plan.ops, warmup=plan.warmup)
                run_options = replace(options, scenario=scenario)
            _flush_servers(pool, target)
            result = run_job(job, run_options, progress, label, finished)
            if result.footprint is not None:
                result.footprint["server"] = _server_footprint(pool, target)
            return result
        finally:
            with deferred_signals():
                shutil.rmtree(workdir, ignore_errors=True)

    return run


def _calibrate(
    target: Target, job: Job, pool: ServerPool, options: RunOptions, progress: Progress, label: str
) -> Plan:
    """Run the target briefly in a directory of its own; the ops its budget allows.

    Its own directory and emptied servers: the measured run starts from the
    state it would have without a calibration (worker 0 clears and pre-fills
    again, and the bytes on disk measured after it are its own).
    """
    assert options.budget is not None
    workdir = Path(tempfile.mkdtemp(prefix=f"djcb-{target.name}-calibration-"))
    try:
        env = TargetEnv(workdir, pool.locations(), options.scenario.entry_limit())
        trial = replace(job, settings=target.django_settings(env), disk_dir=None)
        _flush_servers(pool, target)
        scenario: Scenario | None = calibration_scenario(options.scenario)
        for _ in range(CALIBRATION_ROUNDS):
            assert scenario is not None
            measured = run_job(trial, replace(options, scenario=scenario), progress,
                               f"{label} (calibration)")  # fmt: skip
            scenario = longer_calibration(options.scenario, scenario, measured.wall_s)
            if scenario is None:
                break
    finally:
        with deferred_signals():
            shutil.rmtree(workdir, ignore_errors=True)
    plan = plan_ops(options.scenario, measured.ops_per_s, options.budget)
    cut = (f"{plan.ops:,} ops + {plan.warmup:,} warm-up per process (the scenario's "
           f"{plan.scenario_ops:,}: cut to fit the budget)" if plan.cut
           else f"the scenario's {plan.ops:,} ops per process fit")  # fmt: skip
    progress.say(f"{label}: budget {options.budget:g} s at the calibration's "
                 f"{measured.ops_per_s:,.0f} ops/s: {cut}")  # fmt: skip
    return plan


#: Seconds the harness waits for a server to drop a previous run's data.
FLUSH_TIMEOUT = 120.0


def _flush_servers(pool: ServerPool, target: Target) -> None:
    """Empty the target's servers before its run, with a generous timeout.

    Worker 0 clears the cache through Django as well, but a client's socket
    timeout is sized for cache calls: django-redis's FLUSHDB of a million keys
    on a loaded host outlasted it and failed the target in its set-up. The
    servers are the harness's own, so emptying them here costs no user data.
    """
    for kind in target.servers:
        server = pool.servers.get(kind)
        if server is not None:
            flush = getattr(server, "flush", None)
            if flush is not None:
                try:
                    flush(FLUSH_TIMEOUT)
                except (OSError, ServerUnavailable) as exc:
                    # The server went away during the run (OOM-killed; or a SIGINT to
                    # the process group of a run started where SIGINT is ignored,
                    # which the servers do not ignore). Raised out of the run, it
                    # ended it with a traceback and without the targets that had
                    # finished; it is this target's failure, and the run goes on.
                    raise TargetFailed(
                        f"its {kind} server did not answer before the run: {exc}"
                    ) from exc


def _server_footprint(pool: ServerPool, target: Target) -> dict[str, Any] | None:
    """The memory of the target's server after its run (the first server it needs)."""
    for kind in target.servers:
        server = pool.servers.get(kind)
        if server is not None:
            try:
                return server_memory(kind, server.port, server.pid)
            except OSError:
                return None
    return None


def _skip(
    results: Results, progress: Progress, name: str, reason: str, status: str = "skipped"
) -> None:
    results.skipped.append(Skipped(name, reason, status))
    progress.say(f"{name}: {status.upper()}: {reason}")


def run_job(
    job: Job, options: RunOptions, progress: Progress | None = None, label: str | None = None,
    finished: Callable[[BackendResult], None] | None = None,
) -> BackendResult:
    """Run the scenario's workers against one cache and merge their samples exactly.

    ``finished`` is handed the result before the line that reports it: an interrupt
    that comes once the line is out finds the target among the finished ones
    (returned only, the result was lost to an interrupt on the way back)."""
    progress = progress or Progress()
    label = label or job.name
    scenario = options.scenario
    procs = scenario.procs
    ctx = mp.get_context(options.start_method)
    ready_timeout = options.ready_timeout or 300.0 + scenario.keys / 1000
    ready = ctx.Array("b", procs, lock=False)
    done = ctx.Array("q", scenario.streams, lock=False)  # per thread or task
    start = ctx.Event()
    tmp = Path(tempfile.mkdtemp(prefix=f"djcb-{job.name}-samples-"))
    specs = [
        WorkerSpec(
            index=i,
            scenario=scenario.to_dict(),
            seed=options.seed,
            result_path=str(tmp / f"worker-{i}.pickle"),
            alias=job.alias,
            settings=job.settings,
            settings_module=job.settings_module,
            setup_commands=job.setup_commands if i == 0 else (),
            clear=job.clear,
            delete_keys=job.delete_keys,
            start_timeout=ready_timeout,
            disk_dir=job.disk_dir,
        )
        for i in range(procs)
    ]
    processes = [
        ctx.Process(
            # Dies with the harness, even a SIGKILLed one (orphans.py).
            target=run_orphan_safe,
            args=(os.getpid(), worker_main, spec, ready, done, start),
            name=f"djcb-{job.name}-{spec.index}",
            daemon=True,
        )
        for spec in specs
    ]
    total = procs * (scenario.warmup + scenario.ops)
    progress.phase(label, f"starting {procs} workers (Django set-up, pre-fill)", total)
    try:
        for process in processes:
            process.start()
        _wait_ready(processes, specs, ready, ready_timeout)
        start.set()
        began = time.monotonic()
        pending = list(processes)
        while pending:
            raise_pending()
            sentinels = [p.sentinel for p in pending]
            multiprocessing.connection.wait(sentinels, timeout=0.1)
            pending = [p for p in pending if p.exitcode is None]
            if pending:
                # A worker that died (killed, or a crash in a C extension) never
                # reaches its done count: worker 0 would wait for it in its
                # at-rest measurement, up to start_timeout. Fail at once instead.
                _check_crashed(processes, specs)
            elapsed = time.monotonic() - began
            progress.update(label, sum(done), total, elapsed)
            if elapsed > options.timeout:
                raise TargetFailed(f"timed out: measured phase longer than {options.timeout:g}s")
        progress.update(label, sum(done), total, time.monotonic() - began, force=True)
        worker_results = [_read_result(p, s) for p, s in zip(processes, specs, strict=True)]
    finally:
        with deferred_signals():  # a second Ctrl-C must not leave workers or files
            stop_processes(processes)
            shutil.rmtree(tmp, ignore_errors=True)
    result = merge_results(
        job.name,
        worker_results,
        scenario,
        seed=options.seed,
        verify=job.clear or job.delete_keys,
        per_process=job.per_process,
        host_bound=job.host_bound,
    )
    if finished is not None:
        finished(result)
    progress.say(
        f"{label}: {result.ops:,} ops in {result.wall_s:.2f}s ({result.ops_per_s:,.0f} ops/s; "
        f"set-up and pre-fill {worker_results[0].prepare_s:.1f}s)"
    )
    return result


def _wait_ready(
    processes: Sequence[Any], specs: Sequence[WorkerSpec], ready: Any, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not all(ready):
        raise_pending()
        for process, spec in zip(processes, specs, strict=True):
            if process.exitcode is not None:
                _read_result(process, spec)  # raises with the worker's reason
                raise TargetFailed(f"worker {spec.index} exited before the start")
        if time.monotonic() > deadline:
            raise TargetFailed(f"workers not ready within {timeout:g}s")
        time.sleep(0.01)


def _check_crashed(processes: Sequence[Any], specs: Sequence[WorkerSpec]) -> None:
    """Raise TargetFailed for the first worker that exited with a non-zero code."""
    for process, spec in zip(processes, specs, strict=True):
        if process.exitcode not in (None, 0):
            _read_result(process, spec)  # raises with the worker's own reason, if it wrote one
            raise TargetFailed(f"worker {spec.index} exited with code {process.exitcode}")


def _read_result(process: Any, spec: WorkerSpec) -> WorkerResult:
    path = Path(spec.result_path)
    if not path.exists():
        raise TargetFailed(
            f"worker {spec.index} exited with code {process.exitcode} and wrote no result"
        )
    result = WorkerResult.load(path)
    if result.error:
        last = result.error.strip().splitlines()[-1]
        raise TargetFailed(f"worker {spec.index} raised {last}", result.error)
    return result


def stop_processes(processes: Sequence[Any]) -> None:
    """Terminate (then kill) any worker still running: by its own Process handle/PID
    (also ``djcachebench stampede``'s workers)."""
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            process.terminate()
    for process in processes:
        if process.pid is None:
            continue
        process.join(5)
        if process.exitcode is None:
            process.kill()
            process.join(5)
