"""Timers around the real parts of one backend's get and set, for ``djcachebench breakdown``.

Why timers and not a profiler: a profiler's overhead lands on every Python
call and distorts exactly the small parts being compared, and its output
names functions, not the parts a reader asks about (key making,
serialization, the integrity tag, the SQL statement). Here only the
functions that *are* those parts are wrapped, each by a
``perf_counter_ns`` pair; a wrapped call inside another is charged to the
inner part only (:class:`PartTimer` keeps exclusive time), so the parts add
up, and whatever a call does outside them is reported as ``other``.

Each probe patches one live cache object (instance attributes; for the few
parts reached through a module global or a slotted class, that global or
class attribute) and undoes every patch on exit. The probes know the
backends they measure by their documented parts; an unknown backend gets the
key-making and whole-call timers only.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

#: The parts, in the order the report shows them.
PARTS = ("key", "serialize", "deserialize", "integrity", "l1", "store")
PART_TITLES = {
    "key": "key making",
    "serialize": "serialization",
    "deserialize": "deserialization",
    "integrity": "integrity tag",
    "l1": "L1 lookup/keep",
    "store": "store",
}


class PartTimer:
    """Exclusive nanoseconds per part over the calls made while its patches stand."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = dict.fromkeys(PARTS, 0)
        self._children: list[int] = []

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter_ns
        children = self._children
        totals = self.totals

        def timed(*args: Any, **kwargs: Any) -> Any:
            children.append(0)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - t0
                inner = children.pop()
                totals[part] += elapsed - inner
                if children:
                    children[-1] += elapsed

        return timed

    def snapshot(self) -> dict[str, int]:
        return dict(self.totals)


class Patches:
    """Attribute patches undone in reverse order (``undo``)."""

    def __init__(self, timer: PartTimer) -> None:
        self.timer = timer
        self._undo: list[Callable[[], None]] = []

    def time(self, owner: Any, name: str, part: str) -> None:
        """Replace ``owner.name`` by a timed wrapper charged to ``part``."""
        self.set(owner, name, self.timer.wrap(part, getattr(owner, name)))

    def set(self, owner: Any, name: str, value: Any) -> None:
        old = getattr(owner, name)
        own = getattr(owner, "__dict__", None)
        # An instance attribute that shadows its class's method goes again on
        # undo; a slot, a class or module attribute, or __class__ gets its old value.
        shadows = (own is not None and name not in own and name != "__class__"
                   and not isinstance(owner, (type, ModuleType)))
        setattr(owner, name, value)
        if shadows:
            self._undo.append(lambda: delattr(owner, name))
        else:
            self._undo.append(lambda: setattr(owner, name, old))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


class _TimedCursor:
    """A SQLite cursor whose ``execute`` and fetches are charged to the store."""

    def __init__(self, cursor: Any, timer: PartTimer) -> None:
        self._cursor = cursor
        self.execute = timer.wrap("store", self._execute)
        self.fetchone = timer.wrap("store", cursor.fetchone)
        self.fetchall = timer.wrap("store", cursor.fetchall)

    def _execute(self, *args: Any) -> _TimedCursor:
        self._cursor.execute(*args)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _TimedSealer:
    """The codec's Sealer with every tag computation charged to ``integrity``."""

    def __init__(self, sealer: Any, timer: PartTimer) -> None:
        for name in ("seal", "open", "tag", "tag_large", "check_large"):
            setattr(self, name, timer.wrap("integrity", getattr(sealer, name)))


def _sqlite(cache: Any, patches: Patches) -> str:
    """ShardedSQLiteCache: Django's key making, the codec's serializer and tag,
    the SELECT/UPSERT on the shard's connection."""
    timer = patches.timer
    store = cache._store
    codec = store.codec
    patches.time(cache, "make_and_validate_key", "key")
    patches.time(codec, "_dumps", "serialize")
    patches.time(codec, "_loads", "deserialize")
    patches.set(codec, "_sealer", _TimedSealer(codec._sealer, timer))
    # The memo of verified rows (Codec._open) is the integrity check of a row
    # read again: its compare is charged to the tag's part too.
    base = type(codec)
    timed_open = timer.wrap("integrity", base._open)
    patches.set(codec, "__class__", type("TimedCodec", (base,), {
        "__slots__": (), "_open": lambda self, *a: timed_open(self, *a)}))
    pool = store.pool
    cursor = pool.cursor
    patches.set(pool, "cursor", lambda index: _TimedCursor(cursor(index), timer))
    # Writes run their statements through the core's run (retries, one transaction),
    # which the parts call on the core, not on the facade.
    patches.time(getattr(store, "core", store), "run", "store")
    return "SQLite statement on the shard (reads: SELECT; writes: UPSERT and its bookkeeping)"


def _tiered(cache: Any, patches: Patches) -> str:
    """TieredCache: its inlined L1 hit path, the L1 copy of a written value, and
    its L2 (ShardedSQLiteCache) probed as above."""
    from djcachebench.backends import tiered
    from djcachebench.l1 import L1Map

    timer = patches.timer
    store = _sqlite(cache.l2, patches) if hasattr(cache.l2, "_store") else ""
    patches.time(cache, "make_and_validate_key", "key")
    patches.time(cache, "make_key", "key")
    patches.time(cache, "_records_get", "l1")
    patches.time(cache, "_records_touch", "l1")
    patches.time(tiered, "_token", "l1")  # the entry's coherence token, checked per hit
    patches.time(tiered, "_u64", "l1")
    patches.time(tiered, "_loads", "deserialize")  # a mutable value's private copy
    patches.time(L1Map, "put", "l1")
    patches.set(tiered, "pickle", SimpleNamespace(
        dumps=timer.wrap("serialize", pickle.dumps), loads=timer.wrap("deserialize", pickle.loads),
        HIGHEST_PROTOCOL=pickle.HIGHEST_PROTOCOL))
    return f"L2: {store}" if store else "L2"


def _django_redis(cache: Any, patches: Patches) -> str:
    """django-redis: its key making, its serializer, the redis-py command (the
    loopback round trip, with redis-py packing the command and parsing the reply)."""
    client = cache.client
    patches.time(client, "make_key", "key")
    patches.time(client._serializer, "dumps", "serialize")
    patches.time(client._serializer, "loads", "deserialize")
    for write in (False, True):
        redis_client = client.get_client(write=write)
        if "execute_command" not in vars(redis_client):
            patches.time(redis_client, "execute_command", "store")
    return "redis round trip (redis-py: pack, send, wait, parse; loopback)"


#: Backend class path -> its probe (what it patches, and what its "store" is).
PROBES: dict[str, Callable[[Any, Patches], str]] = {
    "djcachebench.backends.sqlite.ShardedSQLiteCache": _sqlite,
    "djcachebench.backends.tiered.TieredCache": _tiered,
    "django_redis.cache.RedisCache": _django_redis,
}


def probe_for(cache: Any) -> Callable[[Any, Patches], str] | None:
    kind = type(cache)
    return PROBES.get(f"{kind.__module__}.{kind.__qualname__}")


@contextlib.contextmanager
def instrumented(cache: Any, timer: PartTimer) -> Iterator[str]:
    """Patch ``cache``'s parts for the block; yields what its ``store`` part is."""
    patches = Patches(timer)
    probe = probe_for(cache)
    try:
        if probe is None:
            patches.time(cache, "make_and_validate_key", "key")
            yield "not instrumented for this backend: other"
        else:
            yield probe(cache, patches)
    finally:
        patches.undo()
