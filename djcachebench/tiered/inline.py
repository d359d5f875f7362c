"""A write's cross-host invalidation in the L2's own round trip (COHERENCE="cluster").

When the L2 is the redis that carries the invalidations (the default
``COHERENCE_URL``), ``set`` sends ``SET`` and ``PUBLISH`` in one pipeline on the
L2's connection pool instead of a ``SET`` and then a ``PUBLISH`` of its own: one
round trip per write instead of two. Why it keeps the cross-host guarantee:

* redis runs a pipeline's commands in order, so a subscriber receives the
  invalidation only after the new value is in the L2: a remote reader that
  refills after applying it reads the new value, and one that read before keeps
  nothing (its token predates the remote stamp), as with the separate publish;
* the write returns after redis answered the ``PUBLISH`` (``docs/architecture.md``,
  Across hosts: the bound counts from that answer);
* the message is numbered on an inline stream of the publisher
  (``Publisher.inline_message``), so a lost one is a gap the receivers see.

If the pipeline fails, the write is done again through the L2's own ``set``
(with its own error handling: ``IGNORE_EXCEPTIONS`` and the like); a ``set`` is
idempotent, and the key is then published through the publisher's queue as any
write's is. Only ``set`` goes this way: it is the write a site makes most, and
the others (``add``, ``delete``, counters) have results a blind retry could change.

Which L2s: Django's ``RedisCache`` and django-redis with its ``DefaultClient``
(exactly: the herd, shard and sentinel clients write otherwise), when the
server they write to is the ``COHERENCE_URL``'s host and port (pub/sub ignores
the database number). The commands are the ones those backends' own ``set``
sends for the same arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from djcachebench.coherence.cluster.publisher import Publisher
from djcachebench.coherence.cluster.resp import parse_url

__all__ = ["InlineSet", "inline_set"]

#: (key, value, timeout, version, final key, message or None) -> what the
#: L2's own ``set`` returns for that write; raises if the send failed.
_Send = Callable[[Any, Any, Any, Any, str, bytes | None], Any]


def _same_server(url: Any, coherence_url: str) -> bool:
    try:
        a, b = parse_url(str(url)), parse_url(coherence_url)
    except ValueError:
        return False
    return (a.host, a.port) == (b.host, b.port)


def _send_both(redis: Any, write: tuple, channel: bytes | None, message: bytes | None) -> Any:
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


def _django_redis_sender(l2: Any, channel: bytes | None) -> tuple[_Send, str] | None:
    # Not imported for an L2 of another package: django-redis brings in
    # redis-py (and its asyncio client), tens of milliseconds in the first
    # request of every worker process that builds a TieredCache.
    if not any(c.__module__.partition(".")[0] == "django_redis" for c in type(l2).__mro__):
        return None
    try:
        from django_redis.cache import RedisCache as DjangoRedisCache
        from django_redis.client import DefaultClient
    except ImportError:
        return None
    if type(l2) is not DjangoRedisCache:
        # Exactly the class, as for Django's own RedisCache: a subclass may
        # store otherwise in its own set (one that wraps values and caps
        # timeouts would be bypassed, and its get could not read back what the
        # lean send stored).
        return None
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
        return bool(_send_both(client.get_client(write=True), write, channel, message))

    return send, str(servers[0])


def _django_redis_core_sender(l2: Any, channel: bytes | None) -> tuple[_Send, str] | None:
    from django.core.cache.backends.redis import RedisCache

    if type(l2) is not RedisCache:  # a subclass may store differently
        return None
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
        _send_both(cache.get_client(final, write=True), write, channel, message)

    return send, str(servers[0])


class InlineSet:
    """``set`` of a redis L2 in one lean send, with the key's invalidation in it
    when a ``publisher`` is given (see the module doc)."""

    def __init__(self, l2: BaseCache, publisher: Publisher | None, send: _Send,
                 makes_final: Callable[[Any, Any], str]) -> None:
        self._l2 = l2
        self._publisher = publisher
        self._send = send
        self._final = makes_final
        self.fallbacks = 0  # sends that failed (then the L2's own set ran)

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: Any = None, final: str | None = None) -> tuple[str | None, Any]:
        """Write; returns ``(covered, result)``: the final key if its invalidation
        went with the write (the caller must :meth:`done` after its own stamp),
        else None; and what the L2's own ``set`` would have returned."""
        publisher = self._publisher
        if publisher is None:
            try:
                result = self._send(key, value, timeout, version,
                                    final or self._final(key, version), None)
            except Exception:
                self.fallbacks += 1
                result = self._l2.set(key, value, timeout, version=version)
            return None, result
        if final is None:
            final = self._final(key, version)
        stream, message, made = publisher.inline_message(final)
        try:
            result = self._send(key, value, timeout, version, final, message)
        except Exception:
            publisher.inline_done(stream, None)
            self.fallbacks += 1
            return None, self._l2.set(key, value, timeout, version=version)
        publisher.inline_done(stream, made)
        publisher.cover(final)
        return final, result

    def done(self) -> None:
        if self._publisher is not None:
            self._publisher.cover(None)


def inline_set(l2: BaseCache, publisher: Publisher | None,
               coherence_url: str | None) -> InlineSet | None:
    """The lean ``set`` for ``l2`` (None if it is not a redis this module knows),
    carrying the invalidation, on the publisher's host channel, when
    ``publisher`` is given and the L2's write server is the ``coherence_url``'s."""
    channel = None if publisher is None else publisher.channel
    found = _django_redis_sender(l2, channel) or _django_redis_core_sender(l2, channel)
    if found is None:
        return None
    send, server = found
    if publisher is not None and (coherence_url is None
                                  or not _same_server(server, coherence_url)):
        publisher = None  # another redis carries the invalidations: they queue

    def makes_final(key: Any, version: Any) -> str:
        return l2.make_key(key, version=version)

    return InlineSet(l2, publisher, send, makes_final)
