"""Worker processes of tests/coherence/test_tiered_coherence.py (spawned: explicit arguments only).

The property checked: a read that begins after a write or delete of a key was
acknowledged never returns an older value of that key.

Each key has exactly one writer, which numbers its operations on that key
(``seq``, increasing). Before each delete it publishes ``delete_started[k]``;
after each acknowledged operation it publishes ``acked[k] = seq``. A reader
takes ``floor = acked[k]`` *before* its read begins, then:

* a value ``(k, s)`` is correct iff ``s >= floor`` (seqs are unique per key, so
  if the floor operation was a delete, ``s`` is a later set);
* ``None`` is correct iff a delete numbered ``>= floor`` had started by the
  time the read returned.
"""

from __future__ import annotations

import random
import time
from typing import Any

SECRET_KEY = "djcachebench-coherence-test-0123456789abcdef"


def key_name(i: int) -> str:
    return f"coh:{i}"


def setup_django(caches_setting: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY=SECRET_KEY, CACHES=caches_setting, USE_TZ=True)
    django.setup()


def value_of(k: int, s: int, pad: int) -> tuple[Any, ...]:
    """Write ``s`` of key ``k``; ``pad`` bytes make it as long as the test needs."""
    return (k, s, b"p" * pad) if pad else (k, s)


def writer(caches_setting: dict[str, Any], alias: str, keys: list[int], acked: Any,
           delete_started: Any, barrier: Any, duration: float, out: Any, pad: int = 0) -> None:
    setup_django(caches_setting)
    from django.core.cache import caches

    cache = caches[alias]
    rng = random.Random(hash(alias) ^ keys[0])
    seq = {k: int(acked[k]) for k in keys}
    ops = 0
    barrier.wait(60)
    stop = time.monotonic() + duration
    while time.monotonic() < stop:
        k = rng.choice(keys)
        s = seq[k] = seq[k] + 1
        roll = rng.random()
        if roll < 0.2:
            delete_started[k] = s
            if roll < 0.05 and hasattr(cache, "delete_many"):
                cache.delete_many([key_name(k)])
            else:
                cache.delete(key_name(k))
        elif roll < 0.25:
            cache.set_many({key_name(k): value_of(k, s, pad)}, timeout=None)
        else:
            cache.set(key_name(k), value_of(k, s, pad), timeout=None)
        acked[k] = s  # after the write returned: it is acknowledged
        ops += 1
        if rng.random() < 0.3:  # leave readers time to warm their L1s
            time.sleep(0.0005)
    out.put({"role": "writer", "alias": alias, "ops": ops})


def reader(caches_setting: dict[str, Any], alias: str, nkeys: int, acked: Any,
           delete_started: Any, barrier: Any, duration: float, seed: int, out: Any) -> None:
    setup_django(caches_setting)
    from django.core.cache import caches

    cache = caches[alias]
    rng = random.Random(seed)
    violations: list[str] = []
    reads = 0
    for k in range(nkeys):  # warm the L1
        cache.get(key_name(k))
    barrier.wait(60)
    stop = time.monotonic() + duration
    while time.monotonic() < stop:
        k = rng.randrange(nkeys)
        floor = int(acked[k])
        if rng.random() < 0.1:
            value = cache.get_many([key_name(k)]).get(key_name(k))
        else:
            value = cache.get(key_name(k))
        reads += 1
        if value is None:
            if int(delete_started[k]) < floor:
                violations.append(f"key {k}: None after set #{floor} was acknowledged")
        elif value[0] != k or value[1] < floor:
            violations.append(f"key {k}: read {value!r} after op #{floor} was acknowledged")
        if len(violations) >= 20:
            break
    out.put({"role": "reader", "reads": reads, "violations": violations,
             "stats": cache.stats()})


# --- many writers on the same keys ------------------------------------------------


L2_ORDER: list[int] = []  # filled by SlowAckRedisCache in this process


def _slow_ack_class() -> type:
    from django.core.cache.backends.redis import RedisCache

    class SlowAckRedisCache(RedisCache):
        """Django's RedisCache that records the server's order of writes, and is
        slow to return after one.

        The order: each SET/DEL runs in a MULTI/EXEC with an INCR of one counter,
        so ``L2_ORDER[-1]`` after a write is its place in the server's history
        (what "older value" means for two overlapping writes). The delay widens
        the window between the L2 write and the adapter's stamp, where a racing
        writer of the same key can land: the case write-through's
        compare-and-stamp exists for, rare enough otherwise for a short test to
        miss a broken check.
        """

        tiered_returns_what_was_set = True  # pickles, as RedisCache does

        def tiered_failure_count(self) -> int:
            return 0  # raises on failures, as RedisCache does

        def _ordered(self, key: Any, version: Any, command: str, *args: Any) -> None:
            final = self.make_and_validate_key(key, version=version)
            pipe = self._cache.get_client(final, write=True).pipeline(transaction=True)
            pipe.incr("tiered-test:order")
            getattr(pipe, command)(final, *args)
            L2_ORDER.append(pipe.execute()[0])
            time.sleep(random.random() * 0.002)

        def set(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> None:
            assert timeout is None, "this test double only stores without expiry"
            self._ordered(key, version, "set", self._cache._serializer.dumps(value))

        def delete(self, key: Any, version: Any = None) -> bool:
            self._ordered(key, version, "delete")
            return True

    SlowAckRedisCache.__module__ = __name__
    SlowAckRedisCache.__qualname__ = "SlowAckRedisCache"
    return SlowAckRedisCache


def __getattr__(name: str) -> Any:  # built lazily: importing Django needs settings first
    if name == "SlowAckRedisCache":
        cls = _slow_ack_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
#
# Every process reads and writes the same few keys. A shared counter (one lock)
# is the logical clock: each operation takes a tick before it starts and after
# it returns. Writes log (key, id, start, end); reads log (key, id read or None,
# start, end). The parent then checks that no read returned a value whose write
# had been followed by another write of the key that was acknowledged before the
# read began (see check_history).


def mixed(caches_setting: dict[str, Any], alias: str, wid: int, nkeys: int, clock: Any,
          barrier: Any, duration: float, out: Any) -> None:
    setup_django(caches_setting)
    from django.core.cache import caches

    cache = caches[alias]
    lock = clock.get_lock()

    def tick() -> int:
        with lock:
            clock.value += 1
            return clock.value

    rng = random.Random(wid)
    log: list[tuple] = []
    for k in range(nkeys):  # warm the L1
        cache.get(key_name(k))
    barrier.wait(60)
    stop = time.monotonic() + duration
    n = 0
    while time.monotonic() < stop:
        k = rng.randrange(nkeys)
        roll = rng.random()
        start = tick()
        order = len(L2_ORDER)
        if roll < 0.25:
            # A str value: plain values travel on the value board as well.
            cache.set(key_name(k), f"{k}|{wid}|{n}", timeout=None)
            end = tick()
            log.append(("w", k, f"{k}|{wid}|{n}", start, end,
                        L2_ORDER[-1] if len(L2_ORDER) > order else None))
        elif roll < 0.30:
            cache.delete(key_name(k))
            end = tick()
            log.append(("d", k, ("del", wid, n), start, end,
                        L2_ORDER[-1] if len(L2_ORDER) > order else None))
        else:
            value = cache.get(key_name(k))
            log.append(("r", k, value, start, tick(), None))
        n += 1
    out.put({"wid": wid, "log": log, "stats": cache.stats(),
             "write_through": cache.write_through})


def check_history(logs: list[list[tuple]], initial: dict[int, tuple]) -> list[str]:
    """Reads that returned a value older than an acknowledged write.

    "Older" is the L2's own order when the log has it (``SlowAckRedisCache``),
    otherwise real time: a write that began after another was acknowledged.
    A write X is *superseded* for a read R if a write Y of the key, later than
    X in that order, was acknowledged before R began; R may not return X. A
    ``None`` read needs a delete, begun before R ended, not superseded for R.
    """
    import bisect

    writes: dict[int, list[tuple]] = {}
    reads: list[tuple] = []
    for log in logs:
        for op, k, ident, start, end, order in log:
            target = reads if op == "r" else writes.setdefault(k, [])
            target.append((op, k, ident, start, end, order))
    problems: list[str] = []
    for k, ws in writes.items():
        ordered = all(w[5] is not None for w in ws)
        ws.append(("w", k, initial[k], -2, -1, -1))  # the prefill
        # rank: the position in "older than" order; superseded(X) = earliest ack
        # among writes ranked after X (real time: writes that began after X ended).
        if ordered:
            ws.sort(key=lambda w: w[5])
            rank = {w[2]: i for i, w in enumerate(ws)}
            after = [0] * (len(ws) + 1)
            after[-1] = 1 << 62
            for i in range(len(ws) - 1, -1, -1):
                after[i] = min(ws[i][4], after[i + 1])

            def superseded(w: tuple, rank: dict = rank, after: list = after) -> int:
                return after[rank[w[2]] + 1]
        else:
            ws.sort(key=lambda w: w[3])
            starts = [w[3] for w in ws]
            after = [0] * (len(ws) + 1)
            after[-1] = 1 << 62
            for i in range(len(ws) - 1, -1, -1):
                after[i] = min(ws[i][4], after[i + 1])

            def superseded(w: tuple, starts: list = starts, after: list = after) -> int:
                return after[bisect.bisect_right(starts, w[4])]

        by_ident = {w[2]: w for w in ws}
        deletes = sorted((w for w in ws if w[0] == "d"), key=lambda w: w[3])
        del_starts = [d[3] for d in deletes]
        # Among deletes begun before a time, the one superseded latest.
        best_delete: list[tuple] = []
        for d in deletes:
            best_delete.append(d if not best_delete or superseded(d) > superseded(
                best_delete[-1]) else best_delete[-1])
        for _, rk, value, start, end, _ in reads:
            if rk != k:
                continue
            if value is None:
                i = bisect.bisect_left(del_starts, end) - 1
                if i < 0 or superseded(best_delete[i]) < start:
                    problems.append(f"key {k}: None read at [{start},{end}] is stale")
            else:
                w = by_ident.get(value)
                if w is None:
                    problems.append(f"key {k}: read {value!r}, never written")
                elif superseded(w) < start:
                    problems.append(f"key {k}: read {value!r} at [{start},{end}], but a "
                                    f"later write was acknowledged at {superseded(w)}")
    return problems
