"""How many callers a run had and how many cores they shared, said once for every report.

A latency measured with 1,000 callers on two cores is mostly a wait for a
core (or for the interpreter lock, or for the event loop): a reader comparing
it with a figure taken on 32 cores must be told, in the report's header, the
sweep's page and the charts alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def callers(run: Mapping[str, Any]) -> int:
    """Processes times their threads or tasks (``run`` of a results file)."""
    lanes = run.get("tasks") or run.get("threads") or 1
    return int(run["procs"]) * int(lanes)


def describe_concurrency(run: Mapping[str, Any], machine: Mapping[str, Any]) -> str:
    """``2 processes x 100 asyncio tasks = 200 callers (...) sharing 2 usable CPU cores``."""
    procs, cores = run["procs"], machine.get("usable_cpus")
    share = f"sharing {cores} usable CPU core(s)"
    if run.get("tasks"):
        return (f"{procs} processes x {run['tasks']} asyncio tasks = {callers(run):,} callers "
                f"awaiting aget/aset/adelete on {procs} event loop(s), {share}; each process's "
                f"ops are shared by its tasks")
    if (run.get("threads") or 1) > 1:
        return (f"{procs} processes x {run['threads']} threads = {callers(run):,} callers of "
                f"get/set/delete (a backend instance per thread), {share}; a process's threads "
                f"take turns on its interpreter lock, and share its ops")
    return f"{procs} processes, one caller each, {share}"


def lanes_label(run: Mapping[str, Any]) -> str:
    """`` x 100 tasks`` / `` x 10 threads`` / ``""``, for one-line headlines."""
    if run.get("tasks"):
        return f" x {run['tasks']} tasks"
    threads = run.get("threads") or 1
    return f" x {threads} threads" if threads > 1 else ""
