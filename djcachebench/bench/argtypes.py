"""Argument types shared by the commands: a bad value is a usage error (exit 2), at once.

Why here and not where each value is used: a value found wrong after the
servers started, or in a worker (a traceback), costs the user a run and
hides the cause; a negative ``--timeout`` used to run the targets and then
fail them as timed out, ``nan`` disabled it, ``--workers 0`` waited 30 s for
a site that could not answer. argparse reports an ArgumentTypeError with the
option's name and exits 2, so every check lives in a type function.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from djcachebench.bench.values import SizeError, parse_size_range
from djcachebench.bench.workload import PROCS_PER_CORE, max_procs


class OutDirError(ValueError):
    """``--out`` (or the default output folder) cannot be used as a folder."""


def _integer(text: str) -> int:
    cleaned = text.strip().replace("_", "").replace(",", "")
    if not re.fullmatch(r"[+-]?[0-9]+", cleaned):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(cleaned)


def positive_int(text: str) -> int:
    """An integer >= 1 (``1_000`` and ``1,000`` accepted; ``1.5`` is not an integer)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


#: Threads a command starts at most for one option (caller threads of a
#: process, clients of a stampede): each holds a stack, and tens of thousands
#: exhaust the process before the first request.
MAX_THREADS = 4096


def process_count(text: str) -> int:
    """Processes to start: >= 1 and at most ``PROCS_PER_CORE`` per usable core
    (``--workers 100000`` forked until the machine choked)."""
    value = positive_int(text)
    if value > max_procs():
        raise argparse.ArgumentTypeError(
            f"must be <= {max_procs():,} ({PROCS_PER_CORE} per usable core), got {value:,}"
        )
    return value


def thread_count(text: str) -> int:
    """Threads to start: >= 1 and at most :data:`MAX_THREADS`."""
    value = positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_THREADS:,}, got {value:,}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


#: The longest duration an option takes (seconds, 30 days): ``--compute 1e308``
#: passes as finite and then makes every ``time.sleep`` raise OverflowError, which
#: the report would blame on the backend.
MAX_SECONDS = 30 * 86400


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (``nan`` and ``inf`` are not durations),
    at most :data:`MAX_SECONDS`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_SECONDS:,} seconds (30 days), got {text!r}")
    return value


def budget_seconds(text: str) -> float | None:
    """``--budget``: seconds of ops per target, or ``none`` for the scenario's full counts."""
    if text.strip().lower() in ("none", "off", "full"):
        return None
    return positive_seconds(text)


#: wrk's connections at most: each holds buffers, and ``-c 100000000`` makes wrk
#: ask for hundreds of GB before the first request.
MAX_CONNECTIONS = 10_000


def connection_count(text: str) -> int:
    """Connections wrk keeps open: >= 1 and at most :data:`MAX_CONNECTIONS`."""
    value = positive_int(text)
    if value > MAX_CONNECTIONS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_CONNECTIONS:,}, got {value:,}")
    return value


def non_negative_seconds(text: str) -> float:
    """A finite number of seconds >= 0."""
    if text.strip() in ("0", "0.0"):
        return 0.0
    return positive_seconds(text)


def whole_seconds(text: str) -> int:
    """Whole seconds >= 1: wrk's ``-d`` resolution, so what is recorded is what ran."""
    value = positive_seconds(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(
            f"must be a whole number of seconds >= 1 (wrk runs whole seconds), got {text!r}"
        )
    return int(value)


def names(text: str) -> list[str]:
    """A comma-separated list of names: at least one, each once (first-seen order).

    A name given twice would run the same target twice under one name, and
    its runs would merge into fake repeats.
    """
    listed = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not listed:
        raise argparse.ArgumentTypeError(f"no name in {text!r}")
    return listed


def size_range(text: str) -> tuple[int, int]:
    """``N`` or ``MIN-MAX`` sizes (values.parse_size_range)."""
    try:
        return parse_size_range(text)
    except SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def prepare_out_dir(path: Path) -> Path:
    """Create the output folder (and its parents); OutDirError when that cannot be.

    An existing file where the folder should be (or above it) used to end in a
    FileExistsError or NotADirectoryError traceback after every target ran.
    """
    if path.exists() and not path.is_dir():
        raise OutDirError(f"output folder {str(path)!r} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutDirError(f"cannot create the output folder {str(path)!r}: {exc}") from None
    return path


def safe_component(name: str) -> str:
    """``name`` as one safe path component: letters, digits, ``.``, ``_``, ``-``.

    A scenario's name goes into the default output folder's name; ``../x``
    or ``/etc`` must not take the results outside ``./bench/results``.
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    return cleaned or "scenario"
