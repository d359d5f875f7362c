"""What TieredCache needs to know about particular L2 backends: how they fail,
whether they give back what was set, which hand over their pickles, and how
long they keep what they are given. (The expiry of what they return, read
with the value, is ``expiry_readers.py``'s.)

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

import math
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

FailureProbe = Callable[[], int]


def _never() -> int:
    return 0


# Backends that raise on every failure (a miss from them is a real miss).
# Not DatabaseCache: its set/add/touch swallow a DatabaseError ("allowed to fail
# silently") and answer as if nothing were wrong, so a write it dropped would
# have been kept in the L1 and published on the board; its reads do raise, and
# are kept through ``expiry_readers.expiry_reader``.
_RAISING = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.filebased.FileBasedCache",
    "django.core.cache.backends.redis.RedisCache",
    "django.core.cache.backends.memcached.PyLibMCCache",
)


def class_paths(obj: Any) -> set[str]:
    cls = type(obj)
    return {f"{cls.__module__}.{cls.__qualname__}"}


def django_redis_default_client(l2: Any) -> bool:
    """Is this django-redis cache's client exactly ``DefaultClient``? The raw
    readers of ``expiry_readers.py`` send ``GET``/``PTTL`` themselves and decode with the client's
    ``decode``: right for it (and what ``inline.py`` also requires), wrong for
    the others. ``HerdClient`` stores ``(marker, value, herd timeout)`` tuples
    and unpacks them in its own ``get``: read raw, TieredCache would return the
    tuple for the value; ``ShardClient``
    spreads keys over servers that ``get_client(write=True)`` does not name."""
    try:
        from django_redis.client import DefaultClient
    except ImportError:  # pragma: no cover - django-redis is a dependency
        return False
    return type(l2.client) is DefaultClient


def failure_probe(l2: Any) -> FailureProbe | None:
    declared = getattr(l2, "tiered_failure_count", None)
    if callable(declared):
        return declared  # type: ignore[no-any-return]
    paths = class_paths(l2)
    if "djcachebench.backends.tiered.TieredCache" in paths:
        return failure_probe(l2.l2)
    if "django_redis.cache.RedisCache" in paths:
        return None if getattr(l2, "_ignore_exceptions", True) else _never
    if "django.core.cache.backends.memcached.PyMemcacheCache" in paths:
        return None if getattr(l2, "_options", {}).get("ignore_exc") else _never
    if paths.intersection(_RAISING):
        return _never
    return None  # unknown backend (diskcache masks timeouts, for one): do not guess


def masks_failures(l2: Any) -> bool:
    """Does the L2 answer its own failures with a miss, ``False`` or ``None``
    instead of raising (ShardedSQLiteCache, django-redis with
    ``IGNORE_EXCEPTIONS``; an unknown backend is taken to)? A call the circuit
    breaker refuses then answers the same (``tiered/breaker.py``)."""
    return failure_probe(l2) is not _never


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
    paths = class_paths(l2)
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


def read_back_differs(l2: Any) -> Callable[[Any], bool] | None:
    """Which values an L2 that gives back what was set (:func:`returns_what_was_set`)
    still does not give back as they were set: the writer keeps none of those.
    None where there are none (every L2 but django-redis): a write then asks nothing.

    django-redis stores an ``int`` that is neither a ``bool`` nor an ``Enum`` as
    its digits, not pickled, and reads it back as a plain ``int``: an ``int``
    subclass (a ``Price(int)`` with its own attributes) would come back from
    the writer's L1 as itself and from the L2, in every other process, as
    ``int``."""
    paths = class_paths(l2)
    if "djcachebench.backends.tiered.TieredCache" in paths:
        return read_back_differs(l2.l2)
    if "django_redis.cache.RedisCache" in paths:
        return _stored_as_digits
    return None


def _stored_as_digits(value: Any) -> bool:
    return (type(value) is not int and isinstance(value, int)
            and not isinstance(value, bool | Enum))


def pickle_returning(l2: Any) -> tuple[Callable[..., tuple[Any, Any, bytes | None]] | None,
                                        Callable[..., bytes | None] | None]:
    """The L2's ``get`` and ``set`` that also give back the pickle of the value
    (``tiered_get``: ``(value, expires_at, pickle or None)``; ``tiered_set``: the
    pickle or None), each None where the backend does not declare it.

    Why: the L1 keeps a mutable value pickled, so that a caller who mutates
    what it got cannot change what the next read returns. An L2 that pickles
    values anyway (ShardedSQLiteCache with the pickle serializer) can hand
    those bytes over; pickling the value again cost a write or an L1 fill of
    a 10 KB dict as much as the L2's own work on it.
    """
    read = getattr(l2, "tiered_get", None)
    write = getattr(l2, "tiered_set", None)
    return (read if callable(read) else None), (write if callable(write) else None)


# -- the expiry of what was written ---------------------------------------------------

def written_expiry(l2: Any) -> Callable[[float, float], float]:
    """``(timeout, now) -> when the L2 drops a value written at ``now`` with a
    relative timeout (seconds)``: never later than the L2's own expiry.

    Backends that keep whole seconds truncate: Django's ``RedisCache`` keeps
    ``int(timeout)`` seconds (0: not at all), memcached too, counted on a clock
    that ticks once a second (so up to a second less); Django's
    ``DatabaseCache`` stores the expiry with its microseconds dropped (so up to
    a second sooner than ``now + timeout``).
    Keeping a written value in L1 for the full fractional timeout would serve
    it after the L2 dropped it. Unknown backends get the memcached rule: the L1
    may only end earlier.
    """
    paths = class_paths(l2)
    exact = ("djcachebench.backends.sqlite.ShardedSQLiteCache",
             "djcachebench.backends.tiered.TieredCache",
             "django.core.cache.backends.locmem.LocMemCache",
             "django.core.cache.backends.filebased.FileBasedCache",
             "diskcache.djangocache.DjangoCache")
    if paths.intersection(exact):
        return lambda timeout, now: now + timeout
    if "django.core.cache.backends.db.DatabaseCache" in paths:
        return _whole_second_expiry
    if "django_redis.cache.RedisCache" in paths:
        return lambda timeout, now: now + math.floor(timeout * 1000) / 1000.0
    if "django.core.cache.backends.redis.RedisCache" in paths:
        return lambda timeout, now: now + float(math.floor(timeout))
    if any(f"{c.__module__}.{c.__qualname__}" == _MEMCACHED_BASE for c in type(l2).__mro__):
        return lambda timeout, now: now + _memcached_life(timeout)
    return lambda timeout, now: now + float(math.floor(timeout) - 1)


def _whole_second_expiry(timeout: float, now: float) -> float:
    """``now + timeout`` without its fraction of a second (an infinite one stays)."""
    end = now + timeout
    return end if not math.isfinite(end) else float(math.floor(end))


_MEMCACHED_BASE = "django.core.cache.backends.memcached.BaseMemcachedCache"
#: memcached takes an expiry over 30 days as a Unix time, in 32 bits.
_MEMCACHED_RELATIVE_MAX = 30 * 24 * 3600
_MEMCACHED_TIME_MAX = 2**31 - 1


def _memcached_life(timeout: float) -> float:
    """memcached's rule: past 30 days the timeout becomes a Unix time (Django
    adds the current one), and one past 2**31 - 1 is a value memcached does not
    keep at all (it answers a miss at once): then the L1 keeps nothing either,
    or its writer would serve what no other process can read."""
    if timeout > _MEMCACHED_RELATIVE_MAX and (
            not math.isfinite(timeout) or int(timeout) + int(time.time()) > _MEMCACHED_TIME_MAX):
        return 0.0
    return float(math.floor(timeout) - 1)
