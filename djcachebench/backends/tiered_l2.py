"""What TieredCache needs to know about particular L2 backends: how they fail.

Why: "L1 is never filled from a failed read". A value the L2 returned is never
a failure, but a *miss* can be: django-redis with ``IGNORE_EXCEPTIONS``,
diskcache on a database timeout and ShardedSQLiteCache after its retry policy
is spent all answer ``default`` instead of raising. The L1 keeps a known
absence (and, for the writing process, the value it just wrote) only when it
can tell that no such masked failure happened during the operation.

``failure_probe(l2)`` returns a zero-argument callable whose result changes
whenever the L2 has masked a failure in this process (compare it before and
after the operation), or ``None`` when that cannot be told, in which case
the L1 keeps neither absences nor written-through values for that L2.

Backends are recognised by their exact class, never a subclass: a subclass
may fail differently (and tests' doubles do). Any backend, subclass or not,
can state it instead: a method ``tiered_failure_count()`` (the probe) and an
attribute ``tiered_returns_what_was_set = True``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FailureProbe = Callable[[], int]


def _never() -> int:
    return 0


# Backends that raise on every failure (a miss from them is a real miss).
_RAISING = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.filebased.FileBasedCache",
    "django.core.cache.backends.redis.RedisCache",
    "django.core.cache.backends.memcached.PyLibMCCache",
    "django.core.cache.backends.db.DatabaseCache",
)
_SQLITE_FAILURES = ("give_ups", "errors", "corruptions")


def _class_paths(obj: Any) -> set[str]:
    cls = type(obj)
    return {f"{cls.__module__}.{cls.__qualname__}"}


def failure_probe(l2: Any) -> FailureProbe | None:
    declared = getattr(l2, "tiered_failure_count", None)
    if callable(declared):
        return declared  # type: ignore[no-any-return]
    paths = _class_paths(l2)
    if "djcachebench.backends.sqlite.ShardedSQLiteCache" in paths:
        # Per-process counters of the engine: give-ups and I/O errors are the
        # failures it turns into misses / silent write failures.
        counters = getattr(getattr(l2, "_store", None), "stats", None)
        if counters is not None and all(hasattr(counters, n) for n in _SQLITE_FAILURES):
            return lambda: counters.give_ups + counters.errors + counters.corruptions
        return lambda: sum(l2.stats()[n] for n in _SQLITE_FAILURES)
    if "djcachebench.backends.tiered.TieredCache" in paths:
        return failure_probe(l2.l2)
    if "django_redis.cache.RedisCache" in paths:
        return None if getattr(l2, "_ignore_exceptions", True) else _never
    if "django.core.cache.backends.memcached.PyMemcacheCache" in paths:
        return None if getattr(l2, "_options", {}).get("ignore_exc") else _never
    if paths.intersection(_RAISING):
        return _never
    return None  # unknown backend (diskcache masks timeouts, for one): do not guess


def returns_what_was_set(l2: Any) -> bool:
    """Does ``l2.get`` give back what ``pickle.loads(pickle.dumps(value))`` would?

    Write-through keeps the value the caller passed to ``set``; that is only
    the same as reading it back when the L2 stores values by pickling them.
    msgpack or JSON serializers turn tuples into lists (and worse), and some
    memcached clients store ``bool`` as ``int``: for those (and for unknown
    backends) the writer refills from the L2 like every other process.
    """
    declared = getattr(l2, "tiered_returns_what_was_set", None)
    if declared is not None:
        return bool(declared)
    paths = _class_paths(l2)
    if "djcachebench.backends.sqlite.ShardedSQLiteCache" in paths:
        return getattr(l2, "options", {}).get("SERIALIZER") == "pickle"
    if "djcachebench.backends.tiered.TieredCache" in paths:
        return returns_what_was_set(l2.l2)
    if "django_redis.cache.RedisCache" in paths:
        serializer = getattr(l2, "_params", {}).get("OPTIONS", {}).get("SERIALIZER")
        return serializer in (None, "django_redis.serializers.pickle.PickleSerializer")
    if "django.core.cache.backends.redis.RedisCache" in paths:
        return "serializer" not in getattr(l2, "_options", {})
    return bool(paths.intersection((
        "django.core.cache.backends.locmem.LocMemCache",
        "django.core.cache.backends.filebased.FileBasedCache",
    )))
