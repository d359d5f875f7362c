"""Worker processes of tests/test_tiered_coherence.py (spawned: explicit arguments only).

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


def writer(caches_setting: dict[str, Any], alias: str, keys: list[int], acked: Any,
           delete_started: Any, barrier: Any, duration: float, out: Any) -> None:
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
            cache.set_many({key_name(k): (k, s)}, timeout=None)
        else:
            cache.set(key_name(k), (k, s), timeout=None)
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
