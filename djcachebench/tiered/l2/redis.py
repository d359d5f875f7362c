"""Redis as the L2: Django's ``RedisCache`` and django-redis's ``RedisCache``.

What both share: a value and its PTTL read in one round trip from the server
they write to; their LOCATION is a list of servers of which they write to the
first (the others are replicas, and TieredCache reads from the first too), a
redis the cross-host transport can share (the default ``COHERENCE_URL``); a
``set`` that is one command, sent by ``tiered/inline.py`` with the key's
invalidation in the same round trip; a ``clear`` that is one ``FLUSHDB``.

Where they differ: Django's raises on every failure, keeps whole seconds and
gives back what was set unless a serializer is configured; django-redis masks
failures under ``IGNORE_EXCEPTIONS``, keeps milliseconds, stores a plain
``int`` as its digits, and only its ``DefaultClient`` reads and writes the way
the raw commands here do (``HerdClient`` stores ``(marker, value, herd
timeout)`` tuples, ``ShardClient`` spreads keys over servers
``get_client(write=True)`` does not name, a sentinel client finds its master).

django-redis is imported only for an L2 of its own package: it brings in
redis-py (and its asyncio client), tens of milliseconds in the first request of
every worker process that builds a TieredCache.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.utils.module_loading import import_string

from djcachebench.tiered.l2.base import (
    ExpiryReader,
    FailureProbe,
    InlineSend,
    L2Adapter,
    ManyExpiryReader,
    WrittenExpiry,
    never_fails,
)
from djcachebench.tiered.l2.generic import GenericAdapter

__all__ = ["CLASSES", "send_both"]


# -- reading a value with its expiry ----------------------------------------------------

def _expiry_reader(client_of: Callable[[str], Any], final_key: Callable[[Any, Any], Any],
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


def _many_expiry_reader(client: Callable[[], Any], final_key: Callable[[Any, Any], Any],
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


# -- a write and its invalidation in one round trip (tiered/inline.py) --------------------

def send_both(redis: Any, write: tuple, channel: bytes | None, message: bytes | None) -> Any:
    """``write`` and ``PUBLISH channel message`` in one round trip on one of the
    pool's connections: two commands packed into one send, two replies read.
    ``write`` alone when there is no message (then ``channel`` may be None).
    Returns ``write``'s reply.

    Not redis-py's ``Pipeline``, whose per-call bookkeeping costs a good part of
    what the second round trip did. Any failure (an error reply too) leaves the
    connection in an unknown state: it is disconnected before it goes back.
    """
    pool = redis.connection_pool
    conn = pool.get_connection()
    try:
        if message is None:
            conn.send_packed_command(conn.pack_command(*write))
            return conn.read_response()
        conn.send_packed_command(conn.pack_commands([write, ("PUBLISH", channel, message)]))
        reply = conn.read_response()
        conn.read_response()
        return reply
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


# -- what clear flushes (cluster.l2_clear) ---------------------------------------------

def _flushed_client(l2: Any) -> Callable[[], Any] | None:
    """How to get the redis client whose database ``l2.clear()`` flushes, when
    that clear is exactly one ``FLUSHDB`` on the client's write connection.

    Known by the methods a class runs, not by its name: Django's ``RedisCache``
    and django-redis's ``RedisCache``, or subclasses of them that keep their
    ``clear``, over a client that keeps its class's ``clear`` (Django's
    ``RedisCacheClient``; django-redis's ``DefaultClient``, ``HerdClient``,
    ``SentinelClient``; not ``ShardClient``, which flushes every shard). Those
    ``clear``s flush the client their ``get_client(write=True)`` returns, whatever
    it is overridden to do, and that is the client returned here, whose server
    and database the caller checks. Recognising ``DefaultClient`` alone is not
    enough: over ``HerdClient`` the clear would take the hosts' leases with it
    and strict writes after it would wait for nobody while a stopped host served
    the value they replaced; and a client that only overrides ``get_client``
    (to log, say) would still be refused.

    Reads Django's private ``RedisCache._cache`` (its ``RedisCacheClient``): the
    backend has no public accessor for the client its ``clear`` uses."""
    try:
        from django.core.cache.backends.redis import RedisCache, RedisCacheClient
    except ImportError:  # pragma: no cover - Django 4.0+ has it
        return None
    if isinstance(l2, RedisCache):
        if type(l2).clear is not RedisCache.clear:
            return None
        cache = l2._cache
        if type(cache).clear is not RedisCacheClient.clear:
            return None
        return lambda: cache.get_client(None, write=True)
    try:
        from django_redis.cache import RedisCache as DjangoRedisCache
        from django_redis.client import DefaultClient
    except ImportError:  # pragma: no cover - django-redis is a dependency
        return None
    if not isinstance(l2, DjangoRedisCache) or type(l2).clear is not DjangoRedisCache.clear:
        return None
    try:
        client = l2.client
    except Exception:  # a client class it cannot build: its own clear reports that
        return None
    if not isinstance(client, DefaultClient) or type(client).clear is not DefaultClient.clear:
        return None
    return lambda: client.get_client(write=True)


class RedisDescendant(GenericAdapter):
    """A subclass of either redis backend: nothing known of its values or its
    LOCATION; its ``clear`` is known when it keeps its base's."""

    def flushed_client(self) -> Callable[[], Any] | None:
        return _flushed_client(self.l2)


# -- the store: the first server of LOCATION ---------------------------------------------

def _first_location(location: Any) -> str | None:
    """The primary (write) server of a redis LOCATION: a string, a comma-separated
    string or a list (Django's RedisCache and django-redis write to the first)."""
    if isinstance(location, str):
        first = location.split(",")[0].strip()
    elif isinstance(location, (list, tuple)) and location and isinstance(location[0], str):
        first = location[0].strip()
    else:
        return None
    return first or None


def _first_server(location: Any) -> Any:
    """The server of LOCATION a client that writes to the first one writes to."""
    if isinstance(location, str):
        return re.split("[;,]", location)[0]
    if isinstance(location, (list, tuple)) and location:
        return location[0]
    return location


class _RedisStore(RedisDescendant):
    """What both redis backends' LOCATION means, and the transport's default redis."""

    descendant = RedisDescendant

    @classmethod
    def opened_location(cls, location: Any, options: Any, l2: Any) -> Any:
        return _first_server(location)

    @classmethod
    def default_coherence_url(cls, location: Any) -> str | None:
        return _first_location(location)


class DjangoRedisCoreAdapter(_RedisStore):
    """Django's own ``RedisCache`` (``django.core.cache.backends.redis``).

    Reads its private ``_cache`` (the ``RedisCacheClient``), its client's
    ``_serializer``, ``_servers`` and the backend's ``_options``: Django offers no
    public way to reach the client, the serializer it encodes with, the servers
    it writes to or the options it was given."""

    def known_failure_probe(self) -> FailureProbe | None:
        return never_fails

    def known_returns_what_was_set(self) -> bool:
        return "serializer" not in getattr(self.l2, "_options", {})

    # From the primary (``write=True``), never a replica: a value read is kept
    # in the L1 under the token taken before the read, and a replica that has
    # not applied an acknowledged write yet would have its older value kept
    # until L1_TIMEOUT, where the backend alone returns it only while the
    # replica lags.
    def known_expiry_reader(self) -> ExpiryReader | None:
        l2 = self.l2
        backend = l2._cache
        return _expiry_reader(
            lambda k: backend.get_client(k, write=True),
            lambda k, v: l2.make_and_validate_key(k, version=v), backend._serializer.loads, l2)

    def known_many_expiry_reader(self, single: ExpiryReader) -> ManyExpiryReader | None:
        l2 = self.l2
        backend = l2._cache
        return _many_expiry_reader(
            lambda: backend.get_client(None, write=True),
            lambda k, v: l2.make_and_validate_key(k, version=v), backend._serializer.loads, l2)

    def written_expiry(self) -> WrittenExpiry:
        # It keeps int(timeout) seconds (0: not at all).
        return lambda timeout, now: now + float(math.floor(timeout))

    def inline_sender(self, channel: bytes | None) -> tuple[InlineSend, str] | None:
        l2 = self.l2
        cache = l2._cache
        servers = getattr(cache, "_servers", None)
        if not servers:
            return None
        dumps = cache._serializer.dumps

        def send(key: Any, value: Any, timeout: Any, version: Any, final: str,
                 message: bytes | None) -> None:
            # What RedisCache.set and RedisCacheClient.set send (and answer: None).
            l2.validate_key(final)  # RedisCache.set warns about keys memcached would refuse
            seconds = l2.get_backend_timeout(timeout)
            if seconds == 0:
                write: tuple = ("DEL", final)
            elif seconds is None:
                write = ("SET", final, dumps(value))
            else:
                write = ("SET", final, dumps(value), "EX", seconds)
            send_both(cache.get_client(final, write=True), write, channel, message)

        return send, str(servers[0])


def _default_client(l2: Any) -> bool:
    """Is this django-redis cache's client exactly ``DefaultClient``? The raw
    reads and the lean send here are what it does itself (and wrong for the
    other clients: see the module doc)."""
    try:
        from django_redis.client import DefaultClient
    except ImportError:  # pragma: no cover - django-redis is a dependency
        return False
    return type(l2.client) is DefaultClient


def _stored_as_digits(value: Any) -> bool:
    """django-redis stores an ``int`` that is neither a ``bool`` nor an ``Enum`` as
    its digits, not pickled, and reads it back as a plain ``int``: an ``int``
    subclass (a ``Price(int)`` with its own attributes) would come back from the
    writer's L1 as itself and from the L2, in every other process, as ``int``."""
    return (type(value) is not int and isinstance(value, int)
            and not isinstance(value, bool | Enum))


def _ms_expiry(timeout: float, now: float) -> float:
    return now + math.floor(timeout * 1000) / 1000.0


class DjangoRedisAdapter(_RedisStore):
    """django-redis's ``RedisCache`` (``django_redis.cache``).

    Reads its private ``_ignore_exceptions`` and ``_params`` (whether failures
    become misses, and the SERIALIZER it was configured with) and its client's
    ``_server`` (the servers, of which it writes to the first): django-redis has
    no public attribute for them."""

    def known_failure_probe(self) -> FailureProbe | None:
        return None if getattr(self.l2, "_ignore_exceptions", True) else never_fails

    def known_returns_what_was_set(self) -> bool:
        serializer = getattr(self.l2, "_params", {}).get("OPTIONS", {}).get("SERIALIZER")
        return serializer in (None, "django_redis.serializers.pickle.PickleSerializer")

    def read_back_differs(self) -> Callable[[Any], bool] | None:
        return _stored_as_digits

    def known_expiry_reader(self) -> ExpiryReader | None:
        if not _default_client(self.l2):
            return None
        client = self.l2.client
        return _expiry_reader(
            lambda k: client.get_client(write=True), lambda k, v: client.make_key(k, version=v),
            client.decode, self.l2)

    def known_many_expiry_reader(self, single: ExpiryReader) -> ManyExpiryReader | None:
        if not _default_client(self.l2):
            return None
        client = self.l2.client
        return _many_expiry_reader(
            lambda: client.get_client(write=True), lambda k, v: client.make_key(k, version=v),
            client.decode, self.l2)

    def written_expiry(self) -> WrittenExpiry:
        return _ms_expiry

    def inline_sender(self, channel: bytes | None) -> tuple[InlineSend, str] | None:
        try:
            from django_redis.client import DefaultClient
        except ImportError:
            return None
        l2 = self.l2
        client = l2.client
        # Exactly the default client: its subclasses write otherwise (herd packing,
        # shards, a sentinel's master).
        servers = getattr(client, "_server", None)
        if type(client) is not DefaultClient or not servers:
            return None

        def send(key: Any, value: Any, timeout: Any, version: Any, final: str,
                 message: bytes | None) -> bool:
            # What DefaultClient.set sends for these arguments (without nx/xx), and
            # what it answers: True for a stored SET, whether a key went for a DEL.
            if timeout is DEFAULT_TIMEOUT:
                timeout = l2.default_timeout
            nkey = client.make_key(key, version=version)
            if timeout is None:
                write: tuple = ("SET", nkey, client.encode(value))
            elif int(timeout * 1000) <= 0:
                write = ("DEL", nkey)
            else:
                write = ("SET", nkey, client.encode(value), "PX", int(timeout * 1000))
            return bool(send_both(client.get_client(write=True), write, channel, message))

        return send, str(servers[0])

    @classmethod
    def opened_location(cls, location: Any, options: Any, l2: Any) -> Any:
        """The first server, unless its client spreads keys over all of them."""
        if _sharded_client(options):
            return location
        return _first_server(location)

    @classmethod
    def kwarg_db(cls, options: Any) -> Any:
        """django-redis passes its ``CONNECTION_POOL_KWARGS`` to the pool."""
        if not isinstance(options, dict):
            return None
        options = options.get("CONNECTION_POOL_KWARGS")
        return options.get("db") if isinstance(options, dict) else None


def _sharded_client(options: Any) -> bool:
    """Does this django-redis L2 spread keys over its servers (``ShardClient``,
    or a client class not known to write to the first server only)? Then every
    server of the list is part of the store."""
    if not isinstance(options, dict):
        return False
    client = options.get("CLIENT_CLASS")
    if client is None:
        return False
    try:
        from django_redis.client import DefaultClient, ShardClient

        cls = import_string(client) if isinstance(client, str) else client
    except ImportError:
        return True
    if not isinstance(cls, type):
        return True
    return issubclass(cls, ShardClient) or not issubclass(cls, DefaultClient)


CLASSES: dict[str, type[L2Adapter]] = {
    "django.core.cache.backends.redis.RedisCache": DjangoRedisCoreAdapter,
    "django_redis.cache.RedisCache": DjangoRedisAdapter,
}
