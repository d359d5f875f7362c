"""One worker process of a stampede round: Django set-up, its threads, two timed calls each.

Started with ``spawn`` (or ``forkserver``), so everything comes in the
:class:`CrowdSpec` argument; Django is configured here from the target's
settings, as the ``bench`` workers do. The process talks to the parent over
one pipe, in steps (each message a ``(step, payload)`` tuple):

1. Configure Django; process 0 alone runs the target's set-up commands
   (``createcachetable``) and deletes the round's key: an absent key is what an
   expired one is to ``get_or_set``. Send ``configured``.
2. On ``warm``: each thread takes its own cache instance (Django's are per
   thread) and reads a spread of other keys, which opens its connections (every
   SQLite shard, the redis pool, the generation table) before the clock: a
   first access is start-up cost, not the stampede's. It never reads the
   round's key: a TieredCache would remember that absence in its L1, which an
   expired key in production would not have done. Send ``ready``.
3. On ``stampede``, whose payload is the release instant (``time.monotonic_ns()``,
   one clock for every process of the host, a little in the future): every
   thread sleeps until it, notes the time, and calls ``cache.get_or_set(key,
   compute, timeout)``. ``compute`` appends one line to the round's log with
   ``O_APPEND`` (one ``write`` of a short line is atomic, so concurrent
   computations never interleave), sleeps ``compute_s`` and returns a value no
   other computation returns, so the parent can tell which values some
   computation produced. Send ``done``.
4. On ``cached``: the same again, now that the value is stored: what the same
   callers cost the machine with nothing to wait for (the floor under the
   stampede's latencies). Send ``done``, then ``report`` with every call.

Why a release instant and not a ``multiprocessing.Barrier``: its ``notify_all``
wakes the waiters one handshake at a time through one lock shared by every
process, so on a busy 2-core host the last of 100 callers was woken up to
seconds after the first, and that wait, the harness's own, landed in the
figures. Sleeping until an announced instant wakes each thread by its own
timer; how late any of them still starts is recorded (``wakeup_s``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from djcachebench.bench.stampede.data import Call
from djcachebench.bench.worker import error_name, simulated_host

#: Keys each thread reads before the clock (enough to touch all of 8 SQLite shards).
WARM_KEYS = tuple(f"djcb-stampede-warm-{i}" for i in range(128))
#: The value's timeout, long enough to outlive the round.
VALUE_TIMEOUT = 300
#: The two timed phases, in order.
PHASES = ("stampede", "cached")


@dataclass(frozen=True)
class CrowdSpec:
    """Everything a crowd process needs (plain, picklable data)."""

    index: int
    threads: int
    settings: dict[str, Any]
    key: str
    compute_s: float
    log_path: str
    #: Seconds any step waits for the parent or for its own threads before giving up.
    wait_s: float
    setup_commands: tuple[str, ...] = ()
    alias: str = "default"


class StepError(RuntimeError):
    """The parent sent something else than the next step, or nothing in time."""


def crowd_main(spec: CrowdSpec, conn: Any) -> None:
    """Process entry point; ``conn`` is this process's end of its pipe to the parent."""
    try:
        caches = configure_django(spec.settings, spec.index)
        if spec.index == 0:
            from django.core.management import call_command

            for command in spec.setup_commands:
                call_command(command, verbosity=0)
            caches[spec.alias].delete(spec.key)
        conn.send(("configured", None))
        _expect(conn, "warm", spec.wait_s)
        calls = _run_threads(spec, caches, conn)
        conn.send(("report", {p: [asdict(c) for c in calls[p]] for p in PHASES}))
    except BaseException as exc:  # a KeyboardInterrupt too: the parent reads the reason
        with contextlib.suppress(OSError):  # the parent may be gone
            conn.send(("error", "".join(traceback.format_exception(exc)).strip()))
        raise SystemExit(1) from None


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


def _expect(conn: Any, step: str, wait_s: float) -> Any:
    """The payload of the parent's next message, which must be ``step``."""
    if not conn.poll(wait_s):
        raise StepError(f"no {step!r} from the parent within {wait_s:g}s")
    got, payload = conn.recv()
    if got != step:
        raise StepError(f"expected {step!r} from the parent, got {got!r}")
    return payload


def _run_threads(spec: CrowdSpec, caches: Any, conn: Any) -> dict[str, list[Call]]:
    """The threads' two timed calls, each phase started by the parent's release instant."""
    calls: dict[str, list[Call | None]] = {p: [None] * spec.threads for p in PHASES}
    computes = {p: computation(spec.log_path, spec.compute_s, p) for p in PHASES}
    release: dict[str, int] = {}
    announced = {p: threading.Event() for p in PHASES}
    # The main thread is a party too: it reports "ready" and "done" to the parent.
    step = threading.Barrier(spec.threads + 1)
    failures: list[BaseException] = []

    def caller(slot: int) -> None:
        try:
            cache = caches[spec.alias]
            cache.get_many(list(WARM_KEYS))
            step.wait(spec.wait_s)
            for phase in PHASES:
                if not announced[phase].wait(spec.wait_s):
                    raise StepError(f"{phase!r} never announced")
                _sleep_until(release[phase])
                calls[phase][slot] = _timed(cache, spec.key, computes[phase])
                step.wait(spec.wait_s)
        except BaseException as exc:
            failures.append(exc)
            step.abort()  # the main thread and the other callers stop waiting

    threads = [threading.Thread(target=caller, args=(i,), name=f"caller-{i}", daemon=True)
               for i in range(spec.threads)]
    for t in threads:
        t.start()
    try:
        step.wait(spec.wait_s)  # every thread warmed up
        conn.send(("ready", None))
        for phase in PHASES:
            release[phase] = int(_expect(conn, phase, spec.wait_s))
            announced[phase].set()
            step.wait(spec.wait_s)  # every thread returned
            conn.send(("done", None))
    except threading.BrokenBarrierError:
        if failures:
            raise failures[0] from None
        raise
    for t in threads:
        t.join(spec.wait_s)
    if failures:
        raise failures[0]
    return {p: [c for c in calls[p] if c is not None] for p in PHASES}


def _sleep_until(instant_ns: int) -> None:
    remaining = instant_ns - time.monotonic_ns()
    if remaining > 0:
        time.sleep(remaining / 1e9)


def _timed(cache: Any, key: str, compute: Callable[[], str]) -> Call:
    """One ``get_or_set``, from this caller's start to its return; an exception is
    recorded by type (the caller got no value), never raised."""
    start = time.monotonic_ns()
    try:
        value = cache.get_or_set(key, compute, VALUE_TIMEOUT)
    except Exception as exc:
        return Call(start, time.monotonic_ns(), None, error_name(exc))
    end = time.monotonic_ns()
    return Call(start, end, value if isinstance(value, str) else repr(value))
