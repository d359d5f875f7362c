"""The expiry of what an L2 returns: a ``get`` (and ``get_many``) that also
tells when each value it read expires, for the L2s where that can be had.

Why: the L1 keeps a value read from the L2 no longer than the L2 itself
would, and takes that deadline from the very read it keeps, never from
anything shared with other keys. A backend may declare its own readers
(``get_with_expiry``, ``get_many_with_expiry``); for Django's and the usual
third-party backends, recognised by their exact class as in ``l2_traits.py``,
the readers below reach into the backend (one round trip to redis for the
value and its PTTL, the entry's expiry under LocMemCache's lock, the first
pickle of a FileBasedCache file, DatabaseCache's own row). Where none
applies the L1 keeps only what its own process wrote.
"""

from __future__ import annotations

import logging
import math
import pickle
import time
import zlib
from collections.abc import Callable
from typing import Any

from djcachebench.tiered.l2_traits import class_paths, django_redis_default_client

log = logging.getLogger(__name__)

__all__ = ["ExpiryReader", "ManyExpiryReader", "expiry_reader", "many_expiry_reader"]

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

    Read from the database the router *writes* to, as the redis readers read
    from the primary: a replica that lags would hand the L1 the value a write
    acknowledged before the read had replaced, kept until ``L1_TIMEOUT`` (the
    router of Django's cache docs sends reads to a replica).
    Expired rows found are deleted, as Django's ``get_many`` deletes them: left
    in place, a later ``touch`` (which updates whatever row it finds) would
    bring an expired value back. Unlike Django's, the delete
    keeps to rows still expired, so that a value written since is not lost.
    """
    import base64

    from django.db import connections, models, router
    from django.utils.timezone import now as tz_now

    def read_many(keys: list[Any], version: Any = None) -> dict[Any, tuple[Any, float | None]]:
        if not keys:
            return {}
        key_map = {l2.make_and_validate_key(key, version=version): key for key in keys}
        connection = connections[router.db_for_write(l2.cache_model_class)]
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
        expired = []
        for final, value, expires in rows:
            for converter in converters:
                expires = converter(expires, expression, connection)
            if expires < now:
                expired.append(final)
                continue
            value = pickle.loads(base64.b64decode(connection.ops.process_clob(value).encode()))
            out[key_map[final]] = (value, _database_deadline(expires))
        if expired:
            _delete_expired(connection, l2._table, expired, now)
        return out

    return read_many


def _delete_expired(connection: Any, table: str, finals: list[str], now: Any) -> None:
    """Delete the rows of ``finals`` that are still expired at ``now`` (in
    autocommit, as Django's own deletes). A delete that fails leaves the rows
    for the backend's cull: the read it follows has its answer already."""
    from django.db import DatabaseError

    quote = connection.ops.quote_name
    sql = "DELETE FROM %s WHERE %s IN (%s) AND %s < %%s" % (  # noqa: UP031 (as Django's _cull)
        quote(table), quote("cache_key"), ", ".join(["%s"] * len(finals)), quote("expires"))
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, [*finals, connection.ops.adapt_datetimefield_value(now)])
    except DatabaseError:
        log.warning("could not delete %d expired row(s) of %s", len(finals), table)


def _database_deadline(expires: Any) -> float | None:
    """The wall-clock time of a DatabaseCache expiry (a ``datetime``, naive in
    local time without ``USE_TZ``); ``datetime.max`` (no timeout) is never."""
    if expires.year == 9999:
        return math.inf
    try:
        return float(expires.timestamp())
    except (OverflowError, OSError, ValueError):
        return None  # unknown: the value is not kept


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
    paths = class_paths(l2)
    # From the primary (``write=True``), never a replica: a value read is kept
    # in the L1 under the token taken before the read, and a replica that has
    # not applied an acknowledged write yet would have its older value kept
    # until L1_TIMEOUT, where the backend alone returns it only while the
    # replica lags.
    if "django.core.cache.backends.redis.RedisCache" in paths:
        backend = l2._cache
        return _redis_expiry_reader(
            lambda k: backend.get_client(k, write=True),
            lambda k, v: l2.make_and_validate_key(k, version=v), backend._serializer.loads, l2)
    if "django_redis.cache.RedisCache" in paths and django_redis_default_client(l2):
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
    paths = class_paths(l2)
    if single is not None and "django.core.cache.backends.redis.RedisCache" in paths:
        backend = l2._cache
        return _redis_many_expiry_reader(
            lambda: backend.get_client(None, write=True),
            lambda k, v: l2.make_and_validate_key(k, version=v), backend._serializer.loads, l2)
    if (single is not None and "django_redis.cache.RedisCache" in paths
            and django_redis_default_client(l2)):
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
