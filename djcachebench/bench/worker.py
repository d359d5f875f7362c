"""The worker process: configure Django, build the op list, wait, time every call.

Runs in a process started with the ``spawn`` (or ``forkserver``) method, so it
relies on nothing inherited from the parent: everything comes in the
:class:`WorkerSpec` argument (plain, picklable data) and the shared
synchronisation objects. Django is configured here, inside the worker, from
the target's settings dict (or the user's settings module, for the
``cachebench`` management command).

Sequence, and why:

1. ``settings.configure`` + ``django.setup()``, then ``caches[alias]``.
2. Worker 0 alone runs the target's set-up commands (``createcachetable``),
   clears the cache and pre-fills it, *before* it reports ready: the start
   signal is only given once every worker is ready, so no timed operation
   overlaps the pre-fill.
3. The whole op list is generated before the start (RNG cost is not timed).
4. ``ready[i] = 1``, then wait for the start event (all workers released
   together by the parent).
5. Warm-up ops run through the same loop, untimed-for-the-record; then the
   measured ops, each call bracketed by ``time.perf_counter_ns()``.
6. The raw latencies (``array('q')`` of ns per action) go to the worker's
   result file for an exact merge by the parent.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time
import traceback
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from djcachebench.bench.workload import ACTIONS, GET, SET, Op, Scenario, generate_ops

#: How often (in ops) a worker publishes its progress to the shared counter.
PROGRESS_EVERY = 512


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, passed explicitly (works under spawn/forkserver)."""

    index: int
    scenario: dict[str, Any]
    seed: int
    result_path: str
    alias: str = "default"
    #: Settings for ``settings.configure()``; ignored when settings_module is set.
    settings: dict[str, Any] = field(default_factory=dict)
    #: A DJANGO_SETTINGS_MODULE to use instead (the management command).
    settings_module: str | None = None
    #: Worker 0 only: management commands to run, then clear, then pre-fill.
    setup_commands: tuple[str, ...] = ()
    clear: bool = True
    start_timeout: float = 600.0


@dataclass
class WorkerResult:
    """What a worker writes to its result file (read back by the runner)."""

    index: int
    samples: dict[str, bytes] = field(default_factory=dict)  # array('q').tobytes() per action
    miss: dict[str, int] = field(default_factory=dict)
    start_ns: int = 0  # time.monotonic_ns() at the first measured op
    end_ns: int = 0  # ... after the last one
    error: str | None = None

    def latencies(self, action: str) -> array[int]:
        values: array[int] = array("q")
        values.frombytes(self.samples.get(action, b""))
        return values

    def save(self, path: str | Path) -> None:
        tmp = Path(f"{path}.tmp")
        tmp.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)

    @staticmethod
    def load(path: str | Path) -> WorkerResult:
        # Our own file, written by our own worker into a private (0700) temp dir.
        result = pickle.loads(Path(path).read_bytes())
        if not isinstance(result, WorkerResult):
            raise TypeError(f"{path} is not a worker result")
        return result


def worker_main(spec: WorkerSpec, ready: Any, done: Any, start: Any) -> None:
    """Process entry point. ``ready``/``done`` are shared arrays, ``start`` an Event."""
    result = WorkerResult(index=spec.index)
    try:
        cache = _configure(spec)
        scenario = Scenario.from_dict(spec.scenario)
        if spec.index == 0:
            _prepare(cache, spec, scenario)
        ops = generate_ops(scenario, spec.seed, spec.index)
        ready[spec.index] = 1
        if not start.wait(spec.start_timeout):
            raise TimeoutError(f"no start signal within {spec.start_timeout:g}s")
        warmup, measured = ops[: scenario.warmup], ops[scenario.warmup :]
        _run(cache, warmup, None, None, done, spec.index, 0)
        lat: list[array[int]] = [array("q") for _ in ACTIONS]
        miss = [0] * len(ACTIONS)
        result.start_ns = time.monotonic_ns()
        _run(cache, measured, lat, miss, done, spec.index, len(warmup))
        result.end_ns = time.monotonic_ns()
        result.samples = {a: lat[i].tobytes() for i, a in enumerate(ACTIONS)}
        result.miss = {a: miss[i] for i, a in enumerate(ACTIONS)}
        _close(cache)
    except BaseException as exc:  # a KeyboardInterrupt too: the parent reads the reason
        result.error = "".join(traceback.format_exception(exc)).strip()
        result.save(spec.result_path)
        raise SystemExit(1) from None
    result.save(spec.result_path)


def _configure(spec: WorkerSpec) -> Any:
    import django
    from django.conf import settings

    if spec.settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = spec.settings_module
    else:
        values = dict(spec.settings)
        values.setdefault("SECRET_KEY", "djcachebench-benchmark-not-secret")
        values.setdefault("USE_TZ", True)
        settings.configure(**values)
    django.setup()
    from django.core.cache import caches

    return caches[spec.alias]


def _prepare(cache: Any, spec: WorkerSpec, scenario: Scenario) -> None:
    from django.core.management import call_command

    from djcachebench.bench.workload import prefill_items

    for command in spec.setup_commands:
        call_command(command, verbosity=0)
    if spec.clear:
        cache.clear()
    if scenario.prefill:
        for key, value in prefill_items(scenario, spec.seed):
            cache.set(key, value)


def _run(
    cache: Any,
    ops: Sequence[Op],
    lat: list[array[int]] | None,
    miss: list[int] | None,
    done: Any,
    index: int,
    offset: int,
) -> None:
    """Run ``ops``; record latency and misses when ``lat``/``miss`` are given.

    A miss is a get that returned None, or a set/delete that returned False
    (Django's ``delete`` says whether the key existed). The progress counter
    is written every PROGRESS_EVERY ops, outside the timed brackets.
    """
    get, set_, delete = cache.get, cache.set, cache.delete
    clock = time.perf_counter_ns
    record = lat is not None and miss is not None
    for n, (code, key, value) in enumerate(ops, 1):
        if code == GET:
            t0 = clock()
            result = get(key)
            t1 = clock()
            missed = result is None
        elif code == SET:
            t0 = clock()
            result = set_(key, value)
            t1 = clock()
            missed = result is False
        else:
            t0 = clock()
            result = delete(key)
            t1 = clock()
            missed = result is False
        if record:
            lat[code].append(t1 - t0)  # type: ignore[index]
            if missed:
                miss[code] += 1  # type: ignore[index]
        if n % PROGRESS_EVERY == 0:
            done[index] = offset + n
    done[index] = offset + len(ops)


def _close(cache: Any) -> None:
    # Closing is courtesy: a failure here says nothing about speed.
    with contextlib.suppress(Exception):
        cache.close()
