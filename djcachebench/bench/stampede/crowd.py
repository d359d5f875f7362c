"""One worker process of a stampede round: Django set-up, its threads, two timed calls each.

Started with ``spawn`` (or ``forkserver``), so everything comes in the
:class:`CrowdSpec` argument and the shared barriers; Django is configured
here from the target's settings, as the ``bench`` workers do.

Sequence, and why:

1. Configure Django. Process 0 alone runs the target's set-up commands
   (``createcachetable``) and deletes the round's key: an absent key is what an
   expired one is to ``get_or_set``. All processes then meet at ``prepared``,
   so no caller starts before the key is gone.
2. Each thread takes its own cache instance (Django's are per thread) and reads
   a spread of other keys: that opens its connections (every SQLite shard, the
   redis pool, the generation table) before the clock, since a first access is
   start-up cost, not the stampede's. It never reads the round's key: a
   TieredCache would remember that absence in its L1, which an expired key
   in production would not have done.
3. Every thread of every process waits on ``go``; once it breaks, each one
   notes ``time.monotonic_ns()`` (the earliest of these is the release, which
   the parent counts every latency from) and calls ``cache.get_or_set(key, compute,
   timeout)``. ``compute`` appends one line to the round's log with
   ``O_APPEND`` (one ``write`` of a short line is atomic, so concurrent
   computations never interleave), sleeps ``compute_s`` and returns a value
   no other computation returns, so the parent can tell which values some
   computation produced.
4. All meet at ``again`` and call ``get_or_set`` once more: the value is
   cached now, so this burst measures what the same callers cost the machine
   with nothing to wait for (the floor under the stampede's latencies).
5. The calls go to the process's result file (JSON), read by the parent.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from djcachebench.bench.stampede.data import Call
from djcachebench.bench.worker import error_name, simulated_host

#: Keys each thread reads before the clock (enough to touch all of 8 SQLite shards).
WARM_KEYS = tuple(f"djcb-stampede-warm-{i}" for i in range(128))
#: The value's timeout, long enough to outlive the round.
VALUE_TIMEOUT = 300


@dataclass(frozen=True)
class CrowdSpec:
    """Everything a crowd process needs (plain, picklable data)."""

    index: int
    threads: int
    settings: dict[str, Any]
    key: str
    compute_s: float
    log_path: str
    result_path: str
    #: Seconds any barrier is waited on before the process gives up.
    wait_s: float
    setup_commands: tuple[str, ...] = ()
    alias: str = "default"


def crowd_main(spec: CrowdSpec, prepared: Any, go: Any, again: Any) -> None:
    """Process entry point; the barriers are ``multiprocessing`` Barriers of this round."""
    report: dict[str, Any] = {"index": spec.index, "pid": os.getpid(), "stampede": [],
                              "cached": [], "error": None}
    try:
        caches = configure_django(spec.settings, spec.index)
        if spec.index == 0:
            from django.core.management import call_command

            for command in spec.setup_commands:
                call_command(command, verbosity=0)
            caches[spec.alias].delete(spec.key)
        prepared.wait(spec.wait_s)
        stampede, cached = _run_threads(spec, caches, go, again)
        report["stampede"] = [asdict(c) for c in stampede]
        report["cached"] = [asdict(c) for c in cached]
    except BaseException as exc:  # a KeyboardInterrupt too: the parent reads the reason
        for barrier in (prepared, go, again):
            barrier.abort()  # release the other processes now, not at their timeout
        report["error"] = "".join(traceback.format_exception(exc)).strip()
        _save(spec.result_path, report)
        raise SystemExit(1) from None
    _save(spec.result_path, report)


def configure_django(values: dict[str, Any], index: int) -> Any:
    """``settings.configure`` from the target's settings, as the bench workers do."""
    import django
    from django.conf import settings

    values = simulated_host(dict(values), index)
    values.setdefault("SECRET_KEY", "djcachebench-benchmark-not-secret")
    values.setdefault("USE_TZ", True)
    settings.configure(**values)
    django.setup()
    from django.core.cache import caches

    return caches


def computation(log_path: str, seconds: float, phase: str) -> Callable[[], str]:
    """The slow upstream call: logs its start (one atomic line), sleeps, returns a fresh value."""

    def compute() -> str:
        value = f"{os.getpid()}-{uuid.uuid4().hex}"
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{phase} {value}\n".encode())
        finally:
            os.close(fd)
        time.sleep(seconds)
        return value

    return compute


def _run_threads(spec: CrowdSpec, caches: Any, go: Any, again: Any
                 ) -> tuple[list[Call], list[Call]]:
    stampede: list[Call | None] = [None] * spec.threads
    cached: list[Call | None] = [None] * spec.threads
    failures: list[BaseException] = []
    first = computation(spec.log_path, spec.compute_s, "stampede")
    second = computation(spec.log_path, spec.compute_s, "cached")

    def caller(slot: int) -> None:
        try:
            cache = caches[spec.alias]
            cache.get_many(list(WARM_KEYS))
            go.wait(spec.wait_s)
            stampede[slot] = _timed(cache, spec.key, first)
            again.wait(spec.wait_s)
            cached[slot] = _timed(cache, spec.key, second)
        except BaseException as exc:  # a broken barrier: the round is lost
            failures.append(exc)
            for barrier in (go, again):
                barrier.abort()

    threads = [threading.Thread(target=caller, args=(i,), name=f"caller-{i}")
               for i in range(spec.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return [c for c in stampede if c is not None], [c for c in cached if c is not None]


def _timed(cache: Any, key: str, compute: Callable[[], str]) -> Call:
    """One ``get_or_set``, from this caller's wake-up to its return; an exception is
    recorded by type (the caller got no value), never raised."""
    start = time.monotonic_ns()
    try:
        value = cache.get_or_set(key, compute, VALUE_TIMEOUT)
    except Exception as exc:
        return Call(start, time.monotonic_ns(), None, error_name(exc))
    end = time.monotonic_ns()
    return Call(start, end, value if isinstance(value, str) else repr(value))


def _save(path: str, report: dict[str, Any]) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)
