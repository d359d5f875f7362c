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
   clears the cache and pre-fills it with ``set_many`` in batches (one
   pipeline or transaction per batch where the backend has one, so a
   million keys take seconds, not an hour), *before* it reports ready: the
   start signal is only given once every worker is ready, so no timed
   operation overlaps the pre-fill. A cache with ``MAX_ENTRIES`` is
   pre-filled with at most twice that many keys (the most popular ones).
3. The whole op list is generated before the start (RNG cost is not timed).
4. ``ready[i] = 1``, then wait for the start event (all workers released
   together by the parent).
5. Warm-up ops run through the same loop, untimed-for-the-record; then the
   measured ops, each call bracketed by ``time.perf_counter_ns()``. A call
   that raises is counted as an error of its type, not timed; a worker
   whose every measured call raised fails its target with the first error.
6. The raw latencies (``array('q')`` of ns per action) go to the worker's
   result file for an exact merge by the parent, with the worker's RSS
   before the start and after its last op (footprint.py); worker 0 first
   waits for every worker to finish, then counts the entries and measures
   the target's directory on disk, before it closes its connections.
7. Every op's two clock reads and outcome, and every answer's fingerprint,
   are kept (freshness.History, outside the timed brackets) for the
   parent's checks of wrong and stale values (verify.py, freshness.py).
8. A cache that counts its own work (TieredCache's ``stats()``) is read right
   after the warm-up and right after the measured ops, outside the timed
   brackets; the difference goes to the result (cache_stats.py). Only a
   ``stats()`` declared read-only is called (``cache_stats.READ_ONLY_STATS``).

Nothing the harness calls on a cache outside the timed ops may change how
the cache behaves afterwards: besides ``stats()``, those calls are the
set-up's ``clear`` and pre-fill (``set_many``, for diskcache inside its
``transact()``: a write lock per shard and a commit, no setting changed),
worker 0's entry count (``has_key``/``get``/``get_many``, after every
worker's last measured op) and ``close``. None of them writes a setting of
the backend; ``tests/bench/test_bench_read_only.py`` checks diskcache's settings.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time
import traceback
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from djcachebench.bench.cache_stats import snapshot, worker_delta
from djcachebench.bench.calls import PROGRESS_EVERY, error_name
from djcachebench.bench.footprint import count_entries, disk_usage, private_bytes, rss_bytes
from djcachebench.bench.lanes import LaneRun, plan_lanes, run_lanes
from djcachebench.bench.verify import Observer, fingerprint
from djcachebench.bench.workload import (
    ACTIONS,
    Scenario,
    batches,
    generate_ops,
    key_batches,
    prefill_items,
)

__all__ = ["PROGRESS_EVERY", "WorkerResult", "WorkerSpec", "error_name", "worker_main"]


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
    #: Worker 0, when not clearing: delete the workload's own keys before the
    #: run, so what the gets return can still be checked (a user's cache that
    #: must not be cleared; ``manage.py cachebench``).
    delete_keys: bool = False
    start_timeout: float = 600.0
    #: Worker 0: the target's private directory, measured for bytes on disk
    #: (None: the cache's files are not ours to measure, or it has none).
    disk_dir: str | None = None
    #: Worker 0: count the entries at the end (see footprint.py).
    count_entries: bool = True


@dataclass
class WorkerResult:
    """What a worker writes to its result file (read back by the runner)."""

    index: int
    samples: dict[str, bytes] = field(default_factory=dict)  # array('q').tobytes() per action
    miss: dict[str, int] = field(default_factory=dict)
    start_ns: int = 0  # time.monotonic_ns() at the first measured op
    end_ns: int = 0  # ... after the last one
    #: Calls that raised, per action: {error type: count} (not in the samples).
    errors: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Worker 0: pre-fill values the backend refused, {error type: count}.
    prefill_refused: dict[str, int] = field(default_factory=dict)
    #: Worker 0: seconds of set-up, clear and pre-fill (reported, never timed with ops).
    prepare_s: float = 0.0
    #: RSS before the start barrier and after the last measured op, less the samples.
    rss_start: int | None = None
    rss_end: int | None = None
    #: The same, of the pages not shared with a file mapping.
    private_start: int | None = None
    private_end: int | None = None
    #: Worker 0: entries at the end and bytes on disk (see footprint.py).
    entries: dict[str, Any] | None = None
    disk: dict[str, int] | None = None
    #: The cache's own counters over the measured ops (cache_stats.py), or None.
    cache_stats: dict[str, Any] | None = None
    #: The simulated host this worker belongs to (0 when the target simulates none).
    host: int = 0
    #: The values its measured gets returned, as ``{(key, fingerprint): count}``,
    #: checked by the parent against what the workload stored (verify.py).
    seen: dict[tuple[Any, Any], int] = field(default_factory=dict)
    #: Worker 0: the fingerprint of every entry it counted (verify.py).
    entry_prints: dict[Any, Any] | None = None
    #: Worker 0: the key limit its pre-fill ran with (the parent regenerates it).
    prefill_cap: int | None = None
    #: Every op's times and outcome, warm-up included (freshness.History.to_dict).
    history: dict[str, Any] | None = None
    error: str | None = None
    #: This result's lane of its process (its thread or task; 0 without them).
    #: Lane 0 carries the process's figures (RSS, entries, the cache's counters);
    #: the others, in ``lanes``, only their calls'.
    lane: int = 0
    lanes: list[WorkerResult] = field(default_factory=list)
    #: With tasks: the ``a*`` methods the cache leaves to Django's default
    #: (``sync_to_async``: a thread hop per call).
    async_defaults: list[str] | None = None

    def streams(self) -> list[WorkerResult]:
        """This process's results, one per lane, in stream order."""
        return [self, *self.lanes]

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
        result.host = host_number(spec.settings, spec.index)
        cache = _configure(spec)
        scenario = Scenario.from_dict(spec.scenario)
        if spec.index == 0:
            began = time.monotonic()
            result.prefill_refused, result.prefill_cap = _prepare(cache, spec, scenario)
            result.prepare_s = time.monotonic() - began
        lanes = plan_lanes(
            scenario, spec.index, lambda stream: generate_ops(scenario, spec.seed, stream)
        )
        result.rss_start = rss_bytes()
        result.private_start = private_bytes()
        ready[spec.index] = 1

        def start_wait() -> None:
            if not start.wait(spec.start_timeout):
                raise TimeoutError(f"no start signal within {spec.start_timeout:g}s")

        counted: list[Any] = []
        run_lanes(cache, lambda: _thread_cache(spec), lanes, scenario.tasks > 0, start_wait,
                  done, lambda: counted.append(snapshot(cache)), spec.start_timeout)
        if scenario.threads == 1:
            # Before worker 0 probes the keys for its entry count (more gets).
            # Not with threads: each has its own instance, and some caches count
            # per instance (ShardedSQLiteCache), others per process (TieredCache),
            # so neither this instance's figures nor a sum would be the process's.
            result.cache_stats = worker_delta(counted[0], snapshot(cache))
        rss = rss_bytes()
        samples = sum(lane_bytes(lane) for lane in lanes)
        result.rss_end = None if rss is None else rss - samples
        private = private_bytes()
        result.private_end = None if private is None else private - samples
        if spec.index == 0:
            _measure_at_rest(cache, spec, scenario, done, result)
        tallies = [lane.tally for lane in lanes if lane.tally is not None]
        measured = sum(len(lane.measured) for lane in lanes)
        first = next((t.first_error for t in tallies if t.first_error is not None), None)
        if measured and first is not None and sum(sum(t.errors) for t in tallies) == measured:
            raise first  # nothing worked: the target failed, with this reason
        if scenario.tasks:
            result.async_defaults = django_async_defaults(cache)
        parts = [result] + [WorkerResult(spec.index, host=result.host) for _ in lanes[1:]]
        for part, lane in zip(parts, lanes, strict=True):
            part.lane = lane.stream % scenario.lanes
            lane_result(part, lane)
        result.lanes = parts[1:]
        _close(cache)
    except BaseException as exc:  # a KeyboardInterrupt too: the parent reads the reason
        result.error = "".join(traceback.format_exception(exc)).strip()
        result.save(spec.result_path)
        raise SystemExit(1) from None
    result.save(spec.result_path)


def lane_result(part: WorkerResult, lane: LaneRun) -> None:
    """A lane's samples, misses, errors, answers and history into its result."""
    tally = lane.tally
    if tally is None:
        return
    part.start_ns, part.end_ns = lane.start_ns, lane.end_ns
    part.samples = {a: tally.lat[i].tobytes() for i, a in enumerate(ACTIONS)}
    part.miss = {a: tally.miss[i] for i, a in enumerate(ACTIONS)}
    part.errors = {a: dict(tally.kinds[i]) for i, a in enumerate(ACTIONS) if tally.kinds[i]}
    if tally.observer is not None:
        part.seen = tally.observer.seen
    part.history = lane.history.to_dict()


def lane_bytes(lane: LaneRun) -> int:
    """What a lane holds for the parent (samples, history, answers kept to be
    recognised: verify.py), left out of the worker's memory figures."""
    held = lane.history.nbytes() + lane.observer.recognize.nbytes
    if lane.tally is not None:
        held += sum(len(lat) * lat.itemsize for lat in lane.tally.lat)
    return held


def django_async_defaults(cache: Any) -> list[str]:
    """The ``a*`` methods the workload calls that ``cache`` does not implement
    itself: Django's ``BaseCache`` runs them as ``sync_to_async`` of the sync
    method, a thread hop per call."""
    from django.core.cache.backends.base import BaseCache

    return [name for name in ("aget", "aset", "adelete", "aincr")
            if getattr(type(cache), name, None) is getattr(BaseCache, name)]


def _measure_at_rest(
    cache: Any, spec: WorkerSpec, scenario: Scenario, done: Any, result: WorkerResult
) -> None:
    """Worker 0, once every worker finished: entries held and bytes on disk.

    Waits (bounded) for the others, so nothing is still writing, and runs
    before this worker closes its connections, so SQLite's WAL files are
    still on disk. Never timed with the ops; a failure leaves the figures out.
    """
    deadline = time.monotonic() + spec.start_timeout
    while any(done[i] < sum(scenario.stream_counts(i)) for i in range(len(done))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    with contextlib.suppress(Exception):
        if spec.count_entries:
            observer = Observer(scenario)
            prints: dict[Any, Any] = {}
            entries, probed, estimated = count_entries(
                cache,
                scenario.key,
                scenario.keys,
                scenario.value_max,
                spec.seed,
                prints,
                lambda value: fingerprint(observer.kind, value, observer.counters),
            )
            result.entries = {"entries": entries, "probed": probed, "estimated": estimated}
            result.entry_prints = prints
    with contextlib.suppress(Exception):
        if spec.disk_dir:
            result.disk = disk_usage(spec.disk_dir)


#: A target's Django setting (``Target.settings``): split its workers round-robin
#: into this many simulated hosts. Every ``"{host}"`` in a settings string becomes
#: the worker's host number, so each host gets, say, its own TieredCache
#: ``GENERATION_PATH`` (``backends/tiered_redis_cluster.py``).
SIMULATED_HOSTS = "DJCACHEBENCH_SIMULATED_HOSTS"


def host_number(values: Mapping[str, Any], index: int) -> int:
    """Worker ``index``'s simulated host: 0 without SIMULATED_HOSTS (one host)."""
    hosts = values.get(SIMULATED_HOSTS)
    return index % int(hosts) if hosts else 0


def simulated_host(values: dict[str, Any], index: int) -> dict[str, Any]:
    """``values`` as worker ``index`` sees them (unchanged without SIMULATED_HOSTS)."""
    host = str(host_number(values, index))
    if not values.pop(SIMULATED_HOSTS, None):
        return values

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{host}", host)
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(fill(v) for v in value)
        return value

    return fill(values)


def _configure(spec: WorkerSpec) -> Any:
    import django
    from django.conf import settings

    if spec.settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = spec.settings_module
    else:
        values = simulated_host(dict(spec.settings), spec.index)
        values.setdefault("SECRET_KEY", "djcachebench-benchmark-not-secret")
        values.setdefault("USE_TZ", True)
        settings.configure(**values)
    django.setup()
    from django.core.cache import caches

    return caches[spec.alias]


def _thread_cache(spec: WorkerSpec) -> Any:
    """The backend instance Django gives the calling thread (``caches`` is per thread)."""
    from django.core.cache import caches

    return caches[spec.alias]


def _prepare(cache: Any, spec: WorkerSpec, scenario: Scenario) -> tuple[dict[str, int], int | None]:
    """Set-up commands, clear, pre-fill: the pre-fill's refused values by error, and its cap."""
    from django.conf import settings
    from django.core.management import call_command

    for command in spec.setup_commands:
        call_command(command, verbosity=0)
    if spec.clear:
        cache.clear()
    elif spec.delete_keys:
        for keys in key_batches(scenario):
            cache.delete_many(keys)
    refused: dict[str, int] = {}
    cap = None
    if scenario.prefill:
        limit = key_limit(settings.CACHES.get(spec.alias, {}))
        # Twice the limit: the cache ends full and has culled the way the
        # workload's sets make it cull; writing more would only repeat that.
        # (The reference's 1,100 keys are all written, as they always were.)
        cap = None if limit is None else 2 * limit
        for batch in batches(prefill_items(scenario, spec.seed, cap)):
            try:
                with bulk_writes(cache):
                    cache.set_many(batch)
            except Exception:
                # One value the backend refuses (memcached's item size limit
                # raises in pylibmc) must not cost the batch's other keys.
                for key, value in batch.items():
                    try:
                        cache.set(key, value)
                    except Exception as exc:
                        name = error_name(exc)
                        refused[name] = refused.get(name, 0) + 1
    return refused, cap


def bulk_writes(cache: Any) -> contextlib.AbstractContextManager[Any]:
    """One transaction around a pre-fill batch, for backends whose set_many has none.

    diskcache's DjangoCache inherits BaseCache's loop of sets, one SQLite
    commit each (minutes for a million keys); its FanoutCache's ``transact()``
    makes a batch one commit per shard. Set-up only: never used for timed ops.
    """
    inner = getattr(cache, "_cache", None)
    if type(cache).__module__.startswith("diskcache") and hasattr(inner, "transact"):
        return inner.transact()  # type: ignore[no-any-return]
    return contextlib.nullcontext()


def key_limit(entry: Mapping[str, Any]) -> int | None:
    """The ``MAX_ENTRIES`` a CACHES entry (or its inline L2, for TieredCache) sets, if any.

    Pre-filling a 1,000-key cache with a million keys only measures its
    culling (and takes hours for Django's filebased and db caches).
    """
    options = entry.get("OPTIONS") or {}
    if "MAX_ENTRIES" in options:
        return int(options["MAX_ENTRIES"])
    l2 = options.get("L2")
    return key_limit(l2) if isinstance(l2, Mapping) else None


def _close(cache: Any) -> None:
    # Closing is courtesy: a failure here says nothing about speed.
    with contextlib.suppress(Exception):
        cache.close()
