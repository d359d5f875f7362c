"""What TieredCache needs to know about particular L2 backends: how they fail,
the expiry of what they return, and how long they keep what they are given.

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
import pickle
import time
import zlib
from collections.abc import Callable
from typing import Any

FailureProbe = Callable[[], int]


def _never() -> int:
    return 0


# Backends that raise on every failure (a miss from them is a real miss).
# Not DatabaseCache: its set/add/touch swallow a DatabaseError ("allowed to fail
# silently") and answer as if nothing were wrong, so a write it dropped would
# have been kept in the L1 and published on the board (found by an independent
# attacker); its reads do raise, and are kept through ``expiry_reader``.
_RAISING = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.filebased.FileBasedCache",
    "django.core.cache.backends.redis.RedisCache",
    "django.core.cache.backends.memcached.PyLibMCCache",
)


def _class_paths(obj: Any) -> set[str]:
    cls = type(obj)
    return {f"{cls.__module__}.{cls.__qualname__}"}


def _django_redis_default_client(l2: Any) -> bool:
    """Is this django-redis cache's client exactly ``DefaultClient``? The raw
    readers below send ``GET``/``PTTL`` themselves and decode with the client's
    ``decode``: right for it (and what ``inline.py`` also requires), wrong for
    the others. ``HerdClient`` stores ``(marker, value, herd timeout)`` tuples
    and unpacks them in its own ``get``: read raw, TieredCache returned the
    tuple for the value (found by an independent attacker); ``ShardClient``
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
    paths = _class_paths(l2)
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


# -- the expiry of what was read ------------------------------------------------------

ExpiryReader = Callable[[Any, Any, Any], tuple[Any, float | None]]
ManyExpiryReader = Callable[..., dict[Any, tuple[Any, float | None]]]


def _redis_expiry_reader(client_of: Callable[[str], Any], final_key: Callable[[Any, Any], Any],
                         loads: Callable[[Any], Any], l2: Any) -> ExpiryReader:
    """GET and PTTL of one key in one round trip (a pipeline, no transaction).

    The deadline is the time taken *before* the request plus the PTTL the server
    reported: the server's own deadline is that PTTL after it ran the command,
    which is later, so the L1 copy never outlives the server's.
    """

    def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
        final = final_key(key, version)
        started = time.time()
        try:
            pipe = client_of(final).pipeline(transaction=False)
            pipe.get(final)
            pipe.pttl(final)
            raw, pttl = pipe.execute()
        except Exception:  # the backend's own get decides how a failure looks
            return l2.get(key, default, version=version), None
        if raw is None:
            return default, None
        return loads(raw), _deadline(started, pttl)

    return read


def _deadline(started: float, pttl: Any) -> float | None:
    """The wall-clock expiry of a value from the PTTL the server reported."""
    if pttl == -1:
        return math.inf
    if pttl is None or pttl < 0:  # gone between the two commands
        return None
    return started + pttl / 1000.0


def _redis_many_expiry_reader(client: Callable[[], Any], final_key: Callable[[Any, Any], Any],
                              loads: Callable[[Any], Any], l2: Any) -> ManyExpiryReader:
    """GET and PTTL of every key in one round trip, from the primary (as above)."""

    def read_many(keys: list[Any], version: Any = None) -> dict[Any, tuple[Any, float | None]]:
        finals = [final_key(key, version) for key in keys]
        started = time.time()
        try:
            pipe = client().pipeline(transaction=False)
            for final in finals:
                pipe.get(final)
                pipe.pttl(final)
            replies = pipe.execute()
        except Exception:  # the backend's own get_many decides how a failure looks
            return {k: (v, None) for k, v in l2.get_many(keys, version=version).items()}
        out = {}
        for i, key in enumerate(keys):
            raw = replies[2 * i]
            if raw is not None:
                out[key] = (loads(raw), _deadline(started, replies[2 * i + 1]))
        return out

    return read_many


def _locmem_expiry_reader(l2: Any) -> ExpiryReader:
    """LocMemCache's own ``get``, reading the entry's expiry under the same lock."""

    def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
        final = l2.make_and_validate_key(key, version=version)
        with l2._lock:
            if l2._has_expired(final):
                l2._delete(final)
                return default, None
            pickled = l2._cache[final]
            expires = l2._expire_info.get(final, -1)
            l2._cache.move_to_end(final, last=False)
        return pickle.loads(pickled), math.inf if expires is None else expires

    return read


def _filebased_expiry_reader(l2: Any) -> ExpiryReader:
    """FileBasedCache's own ``get``: the expiry is the first pickle in the file."""

    def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
        fname = l2._key_to_file(key, version)
        try:
            with open(fname, "rb") as f:
                try:
                    expires = pickle.load(f)
                except EOFError:
                    return default, None
                if expires is not None and expires < time.time():
                    f.close()
                    l2._delete(fname)
                    return default, None
                value = pickle.loads(zlib.decompress(f.read()))
        except FileNotFoundError:
            return default, None
        return value, math.inf if expires is None else expires

    return read


def _database_many_expiry_reader(l2: Any) -> ManyExpiryReader:
    """DatabaseCache's own ``get_many`` (one SELECT of key, value and expiry),
    keeping each row's expiry: the whole second the database holds, which is
    what its reads compare with (Django drops the microseconds on write).
    Expired rows are misses and are left to the backend's own cull."""
    import base64

    from django.db import connections, models, router
    from django.utils.timezone import now as tz_now

    def read_many(keys: list[Any], version: Any = None) -> dict[Any, tuple[Any, float | None]]:
        if not keys:
            return {}
        key_map = {l2.make_and_validate_key(key, version=version): key for key in keys}
        connection = connections[router.db_for_read(l2.cache_model_class)]
        quote = connection.ops.quote_name
        sql = "SELECT %s, %s, %s FROM %s WHERE %s IN (%s)" % (  # noqa: UP031 (Django's own SQL)
            quote("cache_key"), quote("value"), quote("expires"), quote(l2._table),
            quote("cache_key"), ", ".join(["%s"] * len(key_map)))
        with connection.cursor() as cursor:
            cursor.execute(sql, list(key_map))
            rows = cursor.fetchall()
        expression = models.Expression(output_field=models.DateTimeField())
        converters = (connection.ops.get_db_converters(expression)
                      + expression.get_db_converters(connection))
        now = tz_now()
        out = {}
        for final, value, expires in rows:
            for converter in converters:
                expires = converter(expires, expression, connection)
            if expires < now:
                continue
            value = pickle.loads(base64.b64decode(connection.ops.process_clob(value).encode()))
            out[key_map[final]] = (value, _database_deadline(expires))
        return out

    return read_many


def _database_deadline(expires: Any) -> float | None:
    """The wall-clock time of a DatabaseCache expiry (a ``datetime``, naive in
    local time without ``USE_TZ``); ``datetime.max`` (no timeout) is never."""
    if expires.year == 9999:
        return math.inf
    try:
        return float(expires.timestamp())
    except (OverflowError, OSError, ValueError):
        return None  # unknown: the value is not kept


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


def expiry_reader(l2: Any) -> ExpiryReader | None:
    """A ``get`` that also returns the wall-clock expiry of the value it read.

    ``(value, expires_at)``; ``expires_at`` is ``math.inf`` for a value with no
    expiry and ``None`` when unknown (then the L1 does not keep the value). The
    L1 takes a value's deadline from its own read, never from anything shared
    with other keys. ``None`` when the backend cannot tell (memcached): the L1
    then keeps only what its own process wrote, whose expiry the writer knows.
    """
    declared = getattr(l2, "get_with_expiry", None)
    if callable(declared):
        return declared  # type: ignore[no-any-return]
    paths = _class_paths(l2)
    # From the primary (``write=True``), never a replica: a value read is kept
    # in the L1 under the token taken before the read, and a replica that has
    # not applied an acknowledged write yet would have its older value kept
    # until L1_TIMEOUT, where the backend alone returns it only while the
    # replica lags (found by an independent attacker).
    if "django.core.cache.backends.redis.RedisCache" in paths:
        backend = l2._cache
        return _redis_expiry_reader(
            lambda k: backend.get_client(k, write=True),
            lambda k, v: l2.make_and_validate_key(k, version=v), backend._serializer.loads, l2)
    if "django_redis.cache.RedisCache" in paths and _django_redis_default_client(l2):
        client = l2.client
        return _redis_expiry_reader(
            lambda k: client.get_client(write=True), lambda k, v: client.make_key(k, version=v),
            client.decode, l2)
    if "django.core.cache.backends.locmem.LocMemCache" in paths:
        return _locmem_expiry_reader(l2)
    if "django.core.cache.backends.filebased.FileBasedCache" in paths:
        return _filebased_expiry_reader(l2)
    if "django.core.cache.backends.db.DatabaseCache" in paths:
        many = _database_many_expiry_reader(l2)

        def read_one(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
            return many([key], version).get(key, (default, None))
        return read_one
    if "diskcache.djangocache.DjangoCache" in paths:
        def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
            value, expires = l2.get(key, default, version=version, expire_time=True)
            if value is default:
                return default, None
            return value, math.inf if expires is None else expires
        return read
    return None



def many_expiry_reader(l2: Any, single: ExpiryReader | None) -> ManyExpiryReader | None:
    """``get_many`` with each value's expiry: ``{key: (value, expires_at)}``.

    The backend's own when it declares ``get_many_with_expiry``; for in-process
    and local-file L2s (no round trip to save), the single-key reader per key;
    otherwise None, and ``get_many`` fills the L1 only where the value board
    knows the expiry.
    """
    declared = getattr(l2, "get_many_with_expiry", None)
    if callable(declared):
        return declared  # type: ignore[no-any-return]
    paths = _class_paths(l2)
    if single is not None and "django.core.cache.backends.redis.RedisCache" in paths:
        backend = l2._cache
        return _redis_many_expiry_reader(
            lambda: backend.get_client(None, write=True),
            lambda k, v: l2.make_and_validate_key(k, version=v), backend._serializer.loads, l2)
    if (single is not None and "django_redis.cache.RedisCache" in paths
            and _django_redis_default_client(l2)):
        client = l2.client
        return _redis_many_expiry_reader(
            lambda: client.get_client(write=True), lambda k, v: client.make_key(k, version=v),
            client.decode, l2)
    if single is not None and "django.core.cache.backends.db.DatabaseCache" in paths:
        return _database_many_expiry_reader(l2)
    local = ("django.core.cache.backends.locmem.LocMemCache",
             "django.core.cache.backends.filebased.FileBasedCache")
    if single is None or not paths.intersection(local):
        return None
    missing = object()

    def read_many(keys: list[Any], version: Any = None) -> dict[Any, tuple[Any, float | None]]:
        out = {}
        for key in keys:
            value, expires = single(key, missing, version)
            if value is not missing:
                out[key] = (value, expires)
        return out

    return read_many


# -- the expiry of what was written ---------------------------------------------------

def written_expiry(l2: Any) -> Callable[[float, float], float]:
    """``(timeout, now) -> when the L2 drops a value written at ``now`` with a
    relative timeout (seconds)``: never later than the L2's own expiry.

    Backends that keep whole seconds truncate: Django's ``RedisCache`` keeps
    ``int(timeout)`` seconds (0: not at all), memcached too, counted on a clock
    that ticks once a second (so up to a second less); Django's
    ``DatabaseCache`` stores the expiry with its microseconds dropped (so up to
    a second sooner than ``now + timeout``; found by an independent attacker).
    Keeping a written value in L1 for the full fractional timeout would serve
    it after the L2 dropped it. Unknown backends get the memcached rule: the L1
    may only end earlier.
    """
    paths = _class_paths(l2)
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
