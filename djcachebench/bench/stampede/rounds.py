"""The parent's side of one stampede round: start the crowd, step it, read the figures.

The steps are those of :mod:`.crowd` (``configured``, ``warm``, ``ready``, then
per phase a release instant and ``done``, then ``report``), one pipe per
process. The parent waits for every process at every step, with one deadline
for the whole round; a process that raises sends its traceback and the round
fails with its last line; one that dies without a word fails it with its exit
code. The release instant is :data:`LEAD_S` ahead of the moment the parent
announces it, so that every thread of every process is asleep on its timer
before it comes (how late any still starts is recorded, never hidden).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from djcachebench.bench.orphans import run_orphan_safe
from djcachebench.bench.runner import stop_processes
from djcachebench.bench.stampede.crowd import PHASES, CrowdSpec, crowd_main
from djcachebench.bench.stampede.data import Call, Round

#: Seconds between announcing a phase and its release.
LEAD_S = 0.5


class RoundFailed(RuntimeError):
    """A round broke (a worker raised, died, timed out); the message is the reason."""


@dataclass(frozen=True)
class Plan:
    """How every round of a run is run."""

    procs: int
    threads: int
    compute_s: float
    start_method: str = "spawn"
    timeout_s: float = 600.0
    #: Seconds a worker waits for its next step (Django start-up of every process included).
    wait_s: float = 300.0


def run_round(plan: Plan, settings: dict[str, Any], setup_commands: tuple[str, ...],
              key: str, workdir: Path) -> Round:
    """One round with ``settings``' cache as ``default``; its log lives in ``workdir``."""
    log = workdir / "computations.log"
    spec = CrowdSpec(index=0, threads=plan.threads, settings=settings, key=key,
                     compute_s=plan.compute_s, log_path=str(log), wait_s=plan.wait_s)
    ctx = mp.get_context(plan.start_method)
    pipes = [ctx.Pipe() for _ in range(plan.procs)]
    processes = [
        ctx.Process(target=run_orphan_safe,  # dies with the harness (orphans.py)
                    args=(os.getpid(), crowd_main,
                          replace(spec, index=i, setup_commands=setup_commands if i == 0
                                  else ()), child),
                    name=f"djcb-stampede-{i}", daemon=True)
        for i, (_, child) in enumerate(pipes)
    ]
    crowd = _Crowd([parent for parent, _ in pipes], processes,
                   time.monotonic() + plan.timeout_s)
    try:
        for process in processes:
            process.start()
        for _, child in pipes:
            child.close()  # the parent keeps its own ends: a dead worker reads as EOF
        crowd.gather("configured")
        crowd.send("warm", None)
        crowd.gather("ready")
        releases: dict[str, int] = {}
        for phase in PHASES:
            releases[phase] = time.monotonic_ns() + int(LEAD_S * 1e9)
            crowd.send(phase, releases[phase])
            crowd.gather("done")
        reports = crowd.gather("report")
    finally:
        for parent, _ in pipes:
            parent.close()
        _stop(processes)
    return _figures(reports, log, releases)


class _Crowd:
    """The parent's ends of the pipes, with the round's deadline."""

    def __init__(self, conns: list[Any], processes: list[Any], deadline: float) -> None:
        self.conns, self.processes, self.deadline = conns, processes, deadline

    def send(self, step: str, payload: Any) -> None:
        for conn in self.conns:
            conn.send((step, payload))

    def gather(self, step: str) -> list[Any]:
        """Every worker's ``step`` message, in worker order; RoundFailed otherwise."""
        payloads: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        while pending:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise RoundFailed(f"timed out: {len(pending)} worker(s) never sent {step!r}")
            for conn in multiprocessing.connection.wait(list(pending.values()),
                                                         timeout=min(remaining, 1.0)):
                index = self.conns.index(conn)
                try:
                    got, payload = conn.recv()
                except EOFError:
                    process = self.processes[index]
                    process.join(1)
                    raise RoundFailed(f"worker {index} exited with code {process.exitcode} "
                                      f"before sending {step!r}") from None
                if got == "error":
                    last = str(payload).strip().splitlines()[-1]
                    raise RoundFailed(f"worker {index} raised {last}")
                if got != step:
                    raise RoundFailed(f"worker {index} sent {got!r}, expected {step!r}")
                payloads[index] = payload
                del pending[index]
        return payloads


def _figures(reports: list[dict[str, Any]], log: Path, releases: dict[str, int]) -> Round:
    """The round's figures: the callers' calls against the computation log."""
    lines = log.read_text().splitlines() if log.exists() else []
    logged = [line.split(" ", 1) for line in lines]

    def calls(phase: str) -> list[Call]:
        return [Call(**c) for report in reports for c in report[phase]]

    return Round.from_calls(
        calls("stampede"), calls("cached"), {value for _, value in logged},
        computations=sum(1 for phase, _ in logged if phase == "stampede"),
        cached_computations=sum(1 for phase, _ in logged if phase == "cached"),
        release_ns=releases["stampede"], cached_release_ns=releases["cached"],
    )


def _stop(processes: list[Any]) -> None:
    """Terminate (then kill) any worker still running, by its own Process handle."""
    grace = time.monotonic() + 2.0  # a worker that sent its report is on its way out
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            process.join(max(0.0, grace - time.monotonic()))
    stop_processes(processes)
