"""Coherence stress test of TieredCache over ShardedSQLiteCache, on one host.

Several real processes (``spawn``), each with several threads, hammer a few
keys for a fixed time: reads mostly through the tiered alias (some directly
through the SQLite alias, as a check of the checker: those must never be
stale), writes half through each alias -- ``set`` (with no timeout, an hour,
or a short one, so values expire during the run), ``delete`` (of present and
absent keys), ``incr``, ``touch`` and ``clear()``. The L1 is tiny
(``L1_MAX_ENTRIES``) and the generation table has few slots
(``GENERATION_SLOTS``), so keys evict each other from the L1 and share slots.

Every operation is logged with its start and acknowledgement times; after the
run the logs of all threads are checked together by
:mod:`djcachebench.bench.coherence_history` (whose docstring gives the rules).

Slot count: a ShardedSQLiteCache L2 keeps its own table at
``LOCATION/generations.mmap``, created with its default slot count, and an
existing table keeps its own count. So before any SQLite backend opens the
directory, a throwaway TieredCache (LocMemCache L2, ``GENERATION_PATH`` set to
that file, ``GENERATION_SLOTS``) creates the table with the small count; the
size of the file is reported so a run shows whether that took.

Control: ``--coherence none`` runs the same load with the L1s not kept
coherent; that run must report stale reads (it shows that the logging and the
checker can see a breach at all).

Entry points: ``bench/coherence_stress.py`` (the CLI) and
``tests/coherence/test_coherence_stress.py`` (CI), both through :func:`run`.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import pickle
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from djcachebench.bench.coherence_history import (
    ABSENT,
    CLEAR_KEY,
    ERROR,
    Op,
    Verdict,
    check,
    describe,
    int_value,
    is_int_key,
    key_name,
    str_value,
)

SECRET_KEY = "djcachebench-coherence-stress-0123456789abcdef"
SQLITE = "djcachebench.backends.sqlite.ShardedSQLiteCache"
TIERED = "djcachebench.backends.tiered.TieredCache"
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
REDIS = "django.core.cache.backends.redis.RedisCache"
#: Relative weights of the operations a thread picks (incr only on int keys:
#: on a str key it becomes a set).
MIX = {"get": 64, "get_many": 8, "has_key": 6, "set": 9, "delete": 4, "incr": 5, "touch": 4}
#: Share of reads made directly through the SQLite alias (the checker's control).
L2_READS = 0.1
#: Short timeouts, seconds, log-uniform: values set or touched with one expire
#: during the run, some before a hot key is rewritten, some across a whole second
#: (the L1 rounds published expiries down to whole seconds).
SHORT = (0.02, 2.5)
#: Seconds a spawned process may take to import Django and warm up.
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class StressConfig:
    seconds: float = 60.0
    procs: int = 4
    threads: int = 2
    keys: int = 24
    l1_max_entries: int = 16
    generation_slots: int = 8
    clear_every: float = 1.0
    seed: int = 0
    coherence: str = "host"
    redis_outage_every: float = 0.0


HELP = {
    "seconds": "seconds of concurrent work, after every process has started",
    "procs": "worker processes (spawned)",
    "threads": "threads per worker process",
    "keys": "distinct keys (a few hot ones: key i is picked with weight 1/(i+1))",
    "l1_max_entries": "L1_MAX_ENTRIES of the tiered alias",
    "generation_slots": "slots of the generation table",
    "clear_every": "mean seconds between clear() calls, host-wide",
    "seed": "random seed (thread i of the run uses seed*1000+i)",
    "coherence": 'COHERENCE of the tiered alias ("none": a control run that must '
                 "find stale reads)",
    "redis_outage_every": "above 0: the L2 is a redis-server (Django's RedisCache, socket "
                          "timeout 0.5 s), stopped (SIGSTOP) and continued every this many "
                          "seconds, under the tiered alias's circuit breaker "
                          "(BREAKER_THRESHOLD 3, BREAKER_COOLDOWN 1)",
}


@dataclass
class StressResult:
    config: StressConfig
    verdict: Verdict
    ops: Counter  # (kind, alias, outcome) -> count
    tiered_stats: Counter
    give_ups: int
    table_bytes: int
    first: list[str] = field(default_factory=list)  # descriptions of the first findings

    @property
    def failed_reads(self) -> int:
        return self.verdict.breaches


class StressError(RuntimeError):
    """A worker process failed or hung: no verdict."""


def caches_setting(location: str, config: StressConfig,
                   redis_url: str | None = None) -> dict[str, Any]:
    if redis_url is not None:
        # Calls that raise are logged as errors (not acknowledged): the checker
        # lets a failed write have happened or not, and checks no failed read.
        return {
            "default": {"BACKEND": LOCMEM},
            "l2": {"BACKEND": REDIS, "LOCATION": redis_url, "TIMEOUT": None,
                   "OPTIONS": {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}},
            "tiered": {"BACKEND": TIERED, "TIMEOUT": None, "OPTIONS": {
                "L2": "l2", "L1_MAX_ENTRIES": config.l1_max_entries,
                "GENERATION_SLOTS": config.generation_slots, "COHERENCE": config.coherence,
                "GENERATION_PATH": os.path.join(location, "generations.mmap"),
                "BREAKER_THRESHOLD": 3, "BREAKER_COOLDOWN": 1.0}},
        }
    return {
        "default": {"BACKEND": LOCMEM},
        # A long LOCK_TIMEOUT: a give-up turns a write into a silent no-op, which
        # the checker cannot tell from a lost write. No MAX_ENTRIES: a cull is a
        # removal no log records, which would make absences look stale.
        "l2": {"BACKEND": SQLITE, "LOCATION": location, "TIMEOUT": None,
               "OPTIONS": {"SHARDS": 2, "MAX_ENTRIES": None, "LOCK_TIMEOUT": 10.0,
                           "RETRIES": 3}},
        "tiered": {"BACKEND": TIERED, "TIMEOUT": None,
                   "OPTIONS": {"L2": "l2", "L1_MAX_ENTRIES": config.l1_max_entries,
                               "GENERATION_SLOTS": config.generation_slots,
                               "COHERENCE": config.coherence}},
    }


def _setup_django(caches: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY=SECRET_KEY, CACHES=caches, USE_TZ=True)
    django.setup()


class _Logger:
    """Runs one cache call and logs it as an :class:`Op`."""

    def __init__(self, wid: int) -> None:
        self.wid = wid
        self.ops: list[Op] = []

    def call(self, kind: str, key: int, alias: str, fn: Any, *args: Any,
             arg: Any = None) -> Any:
        t0 = time.monotonic_ns()
        w0 = time.time()
        try:
            res = fn(*args)
        except ValueError as exc:
            res = ABSENT if kind == "incr" else (ERROR, f"ValueError: {exc}")
        except Exception as exc:
            res = (ERROR, f"{type(exc).__name__}: {exc}")
        w1 = time.time()
        t1 = time.monotonic_ns()
        self.ops.append(Op(kind, key, alias, self.wid, t0, t1, w0, w1, arg, res))
        return res


def _whole(timeout: float | None, whole: bool) -> float | None:
    return timeout if timeout is None or not whole else float(max(1, math.ceil(timeout)))


def _short_or_not(rng: random.Random, none_share: float) -> float | None:
    roll = rng.random()
    if roll < none_share:
        return None
    if roll < 2 * none_share:
        return 3600.0
    return round(math.exp(rng.uniform(math.log(SHORT[0]), math.log(SHORT[1]))), 3)


def _thread(config: StressConfig, wid: int, clears: bool, deadline: float,
            log: _Logger, give_ups: list[int]) -> None:
    """One thread's loop until ``deadline`` (monotonic seconds)."""
    from django.core.cache import caches

    cache = {"tiered": caches["tiered"], "l2": caches["l2"]}
    rng = random.Random(config.seed * 1000 + wid)
    kinds = list(MIX)
    weights = list(MIX.values())
    popularity = [1 / (i + 1) for i in range(config.keys)]  # a few hot keys
    n = 0
    clear_mean = config.clear_every * config.procs  # one clearing thread per process
    # Jittered but regular, so a short run still gets its share; the aliases alternate.
    next_clear = time.monotonic() + rng.uniform(0, clear_mean) if clears else None
    clear_aliases = ("tiered", "l2") if wid % 2 == 0 else ("l2", "tiered")
    # Django's RedisCache keeps whole seconds (it truncates, and a set with less
    # than a second deletes the key): whole timeouts keep the checker's model of
    # expiry the store's.
    whole = config.redis_outage_every > 0
    # Over redis the L2 does not stamp its own writes: every write goes through
    # the tiered alias, as a site over redis must (docs/architecture.md); the
    # redis alias is read directly as the checker's control.
    writers = ("tiered",) if whole else ("tiered", "l2")
    if whole:
        clear_aliases = ("tiered",)
    clears_done = 0
    while (now := time.monotonic()) < deadline:
        n += 1
        if next_clear is not None and now >= next_clear:
            alias = clear_aliases[clears_done % len(clear_aliases)]
            clears_done += 1
            log.call("clear", CLEAR_KEY, alias, cache[alias].clear)
            next_clear = now + rng.uniform(0.5, 1.5) * clear_mean
            continue
        k = rng.choices(range(config.keys), popularity)[0]
        name = key_name(k)
        kind = rng.choices(kinds, weights)[0]
        if kind in ("get", "get_many", "has_key"):
            alias = "l2" if rng.random() < L2_READS else "tiered"
            c = cache[alias]
            if kind == "get":
                log.call("get", k, alias, c.get, name)
            elif kind == "has_key":
                log.call("has_key", k, alias, c.has_key, name)
            else:
                other = rng.randrange(config.keys)
                _get_many(log, alias, c, sorted({k, other}))
            continue
        alias = rng.choice(writers)
        c = cache[alias]
        if kind == "incr" and (whole or not is_int_key(k)):
            # Django's RedisCache makes incr of a key that expires or is deleted
            # between its EXISTS and its INCR a new key holding the delta (not
            # atomic there): a value the checker cannot tell from another key's.
            kind = "set"
        if kind == "set":
            value = int_value(k, wid, n) if is_int_key(k) else str_value(k, wid, n)
            timeout = _whole(_short_or_not(rng, 0.3), whole)
            log.call("set", k, alias, c.set, name, value, timeout, arg=(value, timeout))
        elif kind == "delete":
            log.call("delete", k, alias, c.delete, name)
        elif kind == "incr":
            log.call("incr", k, alias, c.incr, name, 1, arg=1)
        else:
            timeout = _whole(_short_or_not(rng, 0.25), whole)
            log.call("touch", k, alias, c.touch, name, timeout, arg=timeout)
    give_ups.append(_give_ups(cache))


def _get_many(log: _Logger, alias: str, cache: Any, keys: list[int]) -> None:
    """One get_many, logged as one read per key (same times)."""
    t0 = time.monotonic_ns()
    w0 = time.time()
    try:
        found: Any = cache.get_many([key_name(k) for k in keys])
    except Exception as exc:
        found = exc
    w1 = time.time()
    t1 = time.monotonic_ns()
    for k in keys:
        if isinstance(found, Exception):
            continue  # a failed read proves nothing
        log.ops.append(Op("get_many", k, alias, log.wid, t0, t1, w0, w1, None,
                          found.get(key_name(k))))


def _give_ups(cache: dict[str, Any]) -> int:
    """Give-ups of this thread's SQLite instances (the tiered alias's own L2 too)."""
    total = 0
    for backend in (cache["l2"], getattr(cache["tiered"], "l2", None)):
        stats = getattr(backend, "stats", None)
        if stats is not None:
            total += int(stats().get("give_ups", 0))
    return total


def _worker(config: StressConfig, caches: dict[str, Any], index: int, out_path: str,
            barrier: Any) -> None:
    """A spawned process: ``config.threads`` threads, then its log to ``out_path``."""
    _setup_django(caches)
    from django.core.cache import caches as django_caches

    for k in range(config.keys):  # warm the L1 (each thread's instance shares it)
        django_caches["tiered"].get(key_name(k))
    barrier.wait(START_TIMEOUT)
    deadline = time.monotonic() + config.seconds
    loggers = [_Logger(index * config.threads + t) for t in range(config.threads)]
    give_ups: list[int] = []
    crashes: list[str] = []

    def body(t: int) -> None:
        try:
            _thread(config, loggers[t].wid, t == 0, deadline, loggers[t], give_ups)
        except BaseException:
            crashes.append(traceback.format_exc())

    threads = [threading.Thread(target=body, args=(t,)) for t in range(config.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if crashes:
        raise RuntimeError("a stress thread crashed:\n" + crashes[0])
    result = {"ops": [op for lg in loggers for op in lg.ops],
              "tiered_stats": django_caches["tiered"].stats(),
              "give_ups": sum(give_ups)}
    with open(out_path, "wb") as f:
        pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)


def _prepare(config: StressConfig, caches: dict[str, Any], location: str,
             out_path: str) -> None:
    """Create the small generation table, then clear and fill every key once (logged)."""
    os.makedirs(location, mode=0o700)
    table = os.path.join(location, "generations.mmap")
    seeder = {"BACKEND": TIERED, "OPTIONS": {
        "L2": {"BACKEND": LOCMEM, "LOCATION": "stress-seed"}, "GENERATION_PATH": table,
        "GENERATION_SLOTS": config.generation_slots, "SHARED_VALUE_BYTES": 0}}
    _setup_django({**caches, "seed": seeder})
    from django.core.cache import caches as django_caches

    django_caches["seed"].get("seed")
    log = _Logger(config.procs * config.threads)  # the thread id after the workers'
    log.call("clear", CLEAR_KEY, "tiered", django_caches["tiered"].clear)
    for k in range(config.keys):
        value = int_value(k, log.wid, k) if is_int_key(k) else str_value(k, log.wid, k)
        log.call("set", k, "l2", django_caches["l2"].set, key_name(k), value, None,
                 arg=(value, None))
    with open(out_path, "wb") as f:
        pickle.dump({"ops": log.ops, "table_bytes": os.path.getsize(table)}, f)


def _stop(procs: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(10)


def run(config: StressConfig, workdir: str | None = None) -> StressResult:
    """Run the stress test and check it. Raises :class:`StressError` if a worker fails."""
    ctx = multiprocessing.get_context("spawn")
    top = tempfile.mkdtemp(prefix="djcb-stress-", dir=workdir)
    location = os.path.join(top, "sqlite")
    server = None
    if config.redis_outage_every > 0:
        from djcachebench.bench.servers import RedisServer

        server = RedisServer().start()
    caches = caches_setting(location, config, None if server is None else server.location)
    procs: list[multiprocessing.process.BaseProcess] = []
    outage: _Outage | None = None
    try:
        prep_out = os.path.join(top, "prepare.pickle")
        prep = ctx.Process(target=_prepare, args=(config, caches, location, prep_out),
                           daemon=True)
        procs.append(prep)
        prep.start()
        prep.join(START_TIMEOUT)
        if prep.exitcode != 0:
            raise StressError(f"the preparing process failed (exit code {prep.exitcode})")
        barrier = ctx.Barrier(config.procs + 1)
        outs = [os.path.join(top, f"worker-{i}.pickle") for i in range(config.procs)]
        workers = [ctx.Process(target=_worker, args=(config, caches, i, outs[i], barrier),
                               daemon=True) for i in range(config.procs)]
        procs.extend(workers)
        for p in workers:
            p.start()
        try:
            barrier.wait(START_TIMEOUT)
        except threading.BrokenBarrierError:
            raise StressError("workers did not start: exit codes "
                              f"{[p.exitcode for p in workers]}") from None
        origin = time.monotonic_ns()
        if server is not None:
            outage = _Outage(server.pid, config.redis_outage_every)
        for p in workers:
            p.join(max(1.0, config.seconds + START_TIMEOUT - (time.monotonic_ns() - origin)
                       / 1e9))
        codes = [p.exitcode for p in workers]
        if any(c != 0 for c in codes):
            raise StressError(f"worker exit codes {codes} (None: hung, killed)")
        return _collect(config, prep_out, outs, origin)
    finally:
        if outage is not None:
            outage.end()
        _stop(procs)
        if server is not None:
            server.stop()
        shutil.rmtree(top, ignore_errors=True)


class _Outage:
    """Stops (SIGSTOP) and continues the L2's server every ``every`` seconds, in a
    thread, until :meth:`end` (which leaves it continued)."""

    def __init__(self, pid: int, every: float) -> None:
        self._pid = pid
        self._every = every
        self._done = threading.Event()
        self.stops = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import signal

        while not self._done.wait(self._every):
            os.kill(self._pid, signal.SIGSTOP)
            self.stops += 1
            self._done.wait(self._every)
            os.kill(self._pid, signal.SIGCONT)

    def end(self) -> None:
        import signal

        self._done.set()
        self._thread.join(self._every * 2 + 5)
        os.kill(self._pid, signal.SIGCONT)


def _collect(config: StressConfig, prep_out: str, outs: list[str], origin: int) -> StressResult:
    with open(prep_out, "rb") as f:
        prep = pickle.load(f)
    ops: list[Op] = list(prep["ops"])
    stats: Counter = Counter()
    give_ups = 0
    for path in outs:
        with open(path, "rb") as f:
            part = pickle.load(f)
        ops.extend(part["ops"])
        stats.update(part["tiered_stats"])
        give_ups += part["give_ups"]
    run_ops = [op for op in ops if op.t0 >= origin]
    verdict = check(ops)
    result = StressResult(config, verdict, _op_counts(run_ops), stats, give_ups,
                          prep["table_bytes"])
    breaches = [f for f in verdict.findings if f.kind != "regressed"]
    regressed = [f for f in verdict.findings if f.kind == "regressed"]
    result.first = [describe(f, ops, origin) for f in breaches[:2] + regressed[:1]]
    return result


def _op_counts(ops: list[Op]) -> Counter:
    counts: Counter = Counter()
    for op in ops:
        if isinstance(op.res, tuple) and op.res and op.res[0] == ERROR:
            outcome = "error"
        elif op.kind == "incr":
            outcome = "absent" if op.res == ABSENT else "done"
        elif op.kind in ("delete", "touch", "has_key"):
            outcome = "true" if op.res else "false"
        elif op.kind in ("get", "get_many"):
            outcome = "miss" if op.res is None else "hit"
        elif op.kind == "set":
            outcome = "no timeout" if op.arg[1] is None else (
                "long" if op.arg[1] >= 3600 else "short")
        else:
            outcome = ""
        counts[op.kind, op.alias, outcome] += 1
    return counts


def report(result: StressResult) -> str:
    c, v = result.config, result.verdict
    slots_note = ("" if result.table_bytes < 1 << 20 else
                  "  (the L2's own full-size table: GENERATION_SLOTS did not apply)")
    lines = [
        f"coherence stress: {c.seconds:g} s, {c.procs} processes x {c.threads} threads, "
        f"{c.keys} keys, L1_MAX_ENTRIES {c.l1_max_entries}, GENERATION_SLOTS "
        f"{c.generation_slots}" + (f"; L2 redis, stopped and continued every "
                                   f"{c.redis_outage_every:g} s" if c.redis_outage_every
                                   else ""),
        f"generation table file: {result.table_bytes} bytes{slots_note}",
        "operations (kind, alias, outcome: count):",
    ]
    for (kind, alias, outcome), n in sorted(result.ops.items()):
        lines.append(f"  {kind:8} {alias:6} {outcome:10} {n:9,}")
    lines += [
        f"checked reads: {v.reads:,} (values {v.value_reads:,}, absences {v.absent_reads:,}, "
        f"not checkable {v.unchecked:,}; absences an expiry could explain "
        f"{v.absences_by_expiry:,})",
        f"stale reads: {v.counts['stale']:,}   wrong-key reads: {v.counts['wrong_key']:,}   "
        f"phantom reads: {v.counts['phantom']:,}   duplicate incr values: "
        f"{v.duplicate_values:,}",
        f"regressed reads (older than an absence an acknowledged incr/touch saw; not a "
        f"breach): {v.counts['regressed']:,}",
        "  by alias read: " + (", ".join(f"{k} via {a}: {n}"
                                         for (k, a), n in sorted(v.by_alias.items()))
                               or "none"),
        f"L2 give-ups (must be 0 for the verdict to hold): {result.give_ups}",
        "tiered stats (all processes): " + ", ".join(
            f"{k} {result.tiered_stats[k]:,}" for k in
            ("l1_hits", "l1_misses", "l2_hits", "l2_misses", "invalidations", "board_hits",
             "published", "no_expiry", "l1_evictions", "coherence_lock_give_ups",
             "breaker_opened", "fast_failures")
            if k in result.tiered_stats),
    ]
    for i, text in enumerate(result.first, 1):
        lines += [f"finding {i}:", text]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: exit 0 when no read was stale, wrong or phantom; 1 otherwise; 2 on failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = StressConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value,
                            help=f"{HELP[name]} (default {value})")
    args = parser.parse_args(argv)
    config = StressConfig(**vars(args))
    try:
        result = run(config)
    except StressError as exc:
        print(f"coherence stress: no verdict: {exc}", file=sys.stderr)
        return 2
    print(report(result))
    return 1 if result.failed_reads else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["StressConfig", "StressError", "StressResult", "main", "report", "run"]
