"""Worker processes of tests/cluster/test_cluster*.py and bench/cluster_stress.py (spawned:
explicit arguments only).

Each simulated host is a ``GENERATION_PATH`` directory of its own; every worker is a
process of one host, with a warm L1, sharing one redis-server with the other hosts.

The property checked, across hosts: a read that starts more than ``bound`` seconds
after a write or delete of the key was acknowledged never returns an older value.

Each key has one writer (some process of some host), which numbers its operations
on the key (``seq``); with ``shared_keys``, every worker of every host writes
every key, taking turns under the key's lock, so the numbers stay the key's order.
Before a delete it publishes ``delete_started[k] = seq``;
after each acknowledged operation ``acked[k] = seq``. Before each read a worker
notes ``(now, acked[k])``: the ack of that seq happened before ``now``. The read's
floor is the newest note taken at least ``bound`` before the read starts, so a
value ``"k|s"`` with ``s < floor`` is a read that started more than ``bound``
after a newer acknowledged write: a violation. ``None`` is correct iff a delete
numbered ``>= floor`` had started by the time the read returned (or, with
``allow_none``, always: a restarted redis-server lost its data). Reads older than
the newest ack but within the bound are counted (``late``), not violations.

A write is acknowledged when ``set()``/``delete()`` returns: TieredCache returns
only after the write's invalidation was handed to redis (its link's flush).
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from typing import Any

from tests.coherence.workers import SECRET_KEY

__all__ = ["SECRET_KEY", "caches_for_host", "standby", "worker"]


def key_name(i: int) -> str:
    return f"xh:{i}"


def caches_for_host(l2_location: str, table_dir: str, coherence_url: str | None = None,
                    coherence: str = "cluster", board: bool = True,
                    strict_lease: float | None = None) -> dict[str, Any]:
    """One simulated host's CACHES: TieredCache over Django's RedisCache, its table
    in ``table_dir``."""
    options: dict[str, Any] = {
        "L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": l2_location},
        "COHERENCE": coherence,
        "GENERATION_PATH": os.path.join(table_dir, "generations.mmap"),
        "GENERATION_SLOTS": 4096,
    }
    if not board:
        options["SHARED_VALUE_BYTES"] = 0
    if strict_lease is not None:
        options["STRICT_LEASE"] = strict_lease
    if coherence_url is not None:
        options["COHERENCE_URL"] = coherence_url
    return {"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                        "OPTIONS": options}}


def _cache(caches_setting: dict[str, Any]) -> Any:
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY=SECRET_KEY, CACHES=caches_setting, USE_TZ=True)
    django.setup()
    from django.core.cache import caches

    return caches["default"]  # COHERENCE="cluster": linked as its table opens


def _stats(cache: Any) -> dict[str, Any]:
    from djcachebench.tiered.cluster import cluster_stats

    return cluster_stats(cache.generation_table)


def _wait_fresh(cache: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while _stats(cache) and not _stats(cache).get("host_fresh"):
        if time.monotonic() > deadline:
            raise RuntimeError("the host never became fresh")
        time.sleep(0.01)


def standby(caches_setting: dict[str, Any], ready: Any) -> None:
    """A process of the host that only stands for subscriber (the one faults hit)."""
    cache = _cache(caches_setting)
    _wait_fresh(cache)
    ready.set()
    while True:
        time.sleep(1)


def worker(caches_setting: dict[str, Any], host: int, wid: int, nworkers: int, nkeys: int,
           acked: Any, delete_started: Any, barrier: Any, duration: float, bound: float,
           out: Any, allow_none: bool = False, write_share: float = 0.1,
           sample_every: float = 0.05, locks: list[Any] | None = None) -> None:
    cache = _cache(caches_setting)
    _wait_fresh(cache)
    rng = random.Random(wid * 7919 + 1)
    # One writer per key, or (``locks``) every worker writes every key, the
    # writes of a key taking turns under its lock so that seqs stay its order.
    own = list(range(nkeys)) if locks else [k for k in range(nkeys) if k % nworkers == wid]
    seq = {k: int(acked[k]) for k in own}
    for k in range(nkeys):  # warm the L1
        cache.get(key_name(k))
    notes: list[deque[tuple[int, int]]] = [deque() for _ in range(nkeys)]
    bound_ns = int(bound * 1e9)
    violations: list[str] = []
    reads = late = writes = errors = 0
    timeline: list[tuple[int, int, int, int]] = []
    barrier.wait(60)
    stats = cache._stats  # the per-process counters (cheap to sample)
    start = time.monotonic()
    stop = start + duration
    next_sample = 0.0
    while True:
        now_s = time.monotonic()
        if now_s >= stop:
            break
        if now_s >= next_sample:
            timeline.append((time.monotonic_ns(), stats.l1_hits, stats.unserved, reads))
            next_sample = now_s + sample_every
        if own and rng.random() < write_share:
            k = rng.choice(own)
            lock = locks[k % len(locks)] if locks else None
            if lock is not None:
                lock.acquire()
            try:
                s = seq[k] = (int(acked[k]) if lock is not None else seq[k]) + 1
                if rng.random() < 0.15:
                    delete_started[k] = s
                    cache.delete(key_name(k))
                else:
                    # A str: plain values travel on the value board as well.
                    cache.set(key_name(k), f"{k}|{s}", timeout=None)
                acked[k] = s  # after the write returned: acknowledged
                writes += 1
            except Exception:  # the L2 is down (allow_none runs restart it): not acked
                if not allow_none:
                    raise
                errors += 1
            finally:
                if lock is not None:
                    lock.release()
            continue
        k = rng.randrange(nkeys)
        t = time.monotonic_ns()
        newest = int(acked[k])
        h = notes[k]
        h.append((t, newest))
        while len(h) >= 2 and h[1][0] <= t - bound_ns:
            h.popleft()
        floor = h[0][1] if h[0][0] <= t - bound_ns else 0
        try:
            value = cache.get(key_name(k))
        except Exception:
            if not allow_none:
                raise
            errors += 1
            continue
        reads += 1
        if value is None:
            if not allow_none and int(delete_started[k]) < floor:
                violations.append(f"host {host} key {k}: None, set #{floor} acknowledged "
                                  f"more than {bound:g} s before")
            elif int(delete_started[k]) < newest and not allow_none:
                late += 1
        else:
            vk, vs = (int(x) for x in value.split("|"))
            if vk != k:
                violations.append(f"host {host} key {k}: another key's value {value!r}")
            elif vs < floor:
                violations.append(f"host {host} key {k}: read #{vs}, #{floor} acknowledged "
                                  f"more than {bound:g} s before")
            elif vs < newest:
                late += 1
        if len(violations) >= 20:
            break
    timeline.append((time.monotonic_ns(), stats.l1_hits, stats.unserved, reads))
    out.put({"host": host, "wid": wid, "pid": os.getpid(), "reads": reads, "writes": writes,
             "late": late, "errors": errors, "violations": violations, "timeline": timeline,
             "stats": cache.stats(), "cluster": _stats(cache)})


# --- the parent: start hosts, run, collect ----------------------------------------


class Run:
    """One run of simulated hosts, as a fault function sees it."""

    def __init__(self, host_dirs: list[str], standbys: list[Any]) -> None:
        self.host_dirs = host_dirs
        self.standbys = standbys  # per host: the standby process (or None)
        self.marks: dict[str, int] = {}  # name -> time.monotonic_ns(), for the checks

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic_ns()

    def host_stats(self, host: int) -> dict[str, Any]:
        from djcachebench.coherence.cluster.hostfile import open_host_file

        return open_host_file(os.path.join(self.host_dirs[host], "generations.mmap")).stats()


def run_hosts(tmp: str, l2_locations: list[str], *, procs: int = 2, nkeys: int = 48,
              duration: float = 10.0, bound: float = 0.3,
              coherence_urls: list[str | None] | None = None, coherence: str = "cluster",
              with_standby: bool = False, fault: Any = None, allow_none: bool = False,
              write_share: float = 0.1, shared_keys: bool = False, board: bool = True,
              strict_lease: float | None = None) -> tuple[list[dict[str, Any]], Run]:
    """Run ``len(l2_locations)`` hosts of ``procs`` workers each; returns the workers'
    results and the :class:`Run` (its marks). ``fault(run)`` runs in the parent once
    the workers are released; it must return before ``duration`` ends."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    hosts = len(l2_locations)
    urls = coherence_urls or [None] * hosts
    settings = []
    for h in range(hosts):
        d = os.path.join(tmp, f"host{h}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        settings.append(caches_for_host(l2_locations[h], d, urls[h], coherence, board,
                                        strict_lease))
    run = Run([os.path.join(tmp, f"host{h}") for h in range(hosts)], [None] * hosts)
    acked = ctx.Array("q", nkeys, lock=False)
    deleted = ctx.Array("q", nkeys, lock=False)
    nworkers = hosts * procs
    barrier = ctx.Barrier(nworkers + 1)
    locks = [ctx.Lock() for _ in range(16)] if shared_keys else None
    out = ctx.Queue()
    children: list[Any] = []
    try:
        if with_standby:
            for h in range(hosts):
                ready = ctx.Event()
                p = ctx.Process(target=standby, args=(settings[h], ready),
                                daemon=True)
                p.start()
                children.append(p)
                run.standbys[h] = p
                if not ready.wait(30):
                    raise RuntimeError(f"host {h}'s standby never became fresh")
        for w in range(nworkers):
            h = w % hosts
            p = ctx.Process(target=worker, daemon=True, args=(
                settings[h], h, w, nworkers, nkeys, acked, deleted, barrier, duration, bound,
                out, allow_none, write_share, 0.05, locks))
            p.start()
            children.append(p)
        barrier.wait(120)
        run.mark("start")
        if fault is not None:
            fault(run)
        results = [out.get(timeout=duration + 60) for _ in range(nworkers)]
        return results, run
    finally:
        for p in children:
            if p.is_alive():
                p.kill()  # by its own PID (multiprocessing keeps it)
            p.join(5)


def served_between(results: list[dict[str, Any]], host: int, t0: int, t1: int) -> tuple[int, int]:
    """(L1 hits, reads) of ``host``'s workers between two monotonic_ns times, from
    their timelines (samples inside the window)."""
    hits = reads = 0
    for r in results:
        if r["host"] != host:
            continue
        inside = [s for s in r["timeline"] if t0 <= s[0] <= t1]
        if len(inside) >= 2:
            hits += inside[-1][1] - inside[0][1]
            reads += inside[-1][3] - inside[0][3]
    return hits, reads
