"""What a TieredCache ``clear()`` under strict writes leaves of the hosts' protocol.

Its L2, when it is the redis and database that carry the hosts' leases, is
flushed by one script that keeps the leases and the ack lists not yet popped
(``StrictWriter.flush_keeping_members``). An L2 whose clear is one ``FLUSHDB``
is recognised whatever its client, not only as ``DefaultClient`` (over
``HerdClient`` a clear that took the leases with it would leave strict writes
after it waiting for nobody while a stopped host served the value they
replaced); and the script keeps the acks pushed for another writer's strict
write, which would otherwise raise ``StrictWriteUnconfirmed`` with every host
healthy. The tests of the leases' side
of the script are in ``test_cluster_strict.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.redis import RedisCache
from django_redis.client import DefaultClient

from djcachebench.bench.servers import RedisServer
from djcachebench.coherence.cluster.lease import ACK_TTL_MS, ack_prefix
from djcachebench.coherence.cluster.resp import RespConnection, parse_url
from djcachebench.tiered.cluster import l2_clear
from tests.cluster.test_cluster_strict import _member, _TwoHosts


class _KeepsClear(RedisCache):
    """A subclass that leaves ``clear`` as Django wrote it."""


class _OwnClear(RedisCache):
    """A subclass with a ``clear`` of its own: nothing is assumed of it."""

    def clear(self) -> None:
        super().clear()


def _django_redis(location: str, client: str) -> Any:
    from django_redis.cache import RedisCache as DjangoRedisCache

    return DjangoRedisCache(location, {"OPTIONS": {"CLIENT_CLASS": client}})


class LoggingClient(DefaultClient):
    """A client whose ``get_client`` only wraps the default one (to log, say)."""

    def get_client(self, *args: Any, **kwargs: Any) -> Any:
        return super().get_client(*args, **kwargs)


L2S = {
    "herd client": lambda url: _django_redis(url, "django_redis.client.HerdClient"),
    "client with its own get_client": lambda url: _django_redis(
        url, f"{__name__}.LoggingClient"),
    "default client": lambda url: _django_redis(url, "django_redis.client.DefaultClient"),
    "RedisCache subclass": lambda url: _KeepsClear(url, {}),
}


@pytest.mark.parametrize("kind", list(L2S))
def test_a_clear_over_a_client_that_flushes_as_django_does_keeps_the_leases(
        tmp_path: Path, redis_server: RedisServer, kind: str) -> None:
    """Over ``HerdClient`` (and a subclass of Django's RedisCache, and a client that
    overrides ``get_client`` only to wrap it) the clear must not send its own
    ``FLUSHDB``, which takes the leases; the wrapping client pins that the L2 is
    not recognised by asking for DefaultClient's ``get_client``."""
    base = f"test:strict-clear-{kind.replace(' ', '-')}"
    hosts = _TwoHosts(tmp_path, redis_server.location, base)
    try:
        l2 = L2S[kind](redis_server.location)
        lease = _member(redis_server.location, base, hosts.b_host.host_id)
        assert lease is not None
        l2.set("user-key", "v")
        l2_clear(l2, hosts.link)()
        assert l2.get("user-key") is None  # the L2 is empty, as its own clear leaves it
        assert _member(redis_server.location, base, hosts.b_host.host_id) == lease
        hosts.write()  # B is still a member and acks
    finally:
        hosts.close()


def test_a_clear_of_its_own_or_over_shards_is_the_l2s_own(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Nothing is assumed of a ``clear`` the project did not read: it runs as it is."""
    base = "test:strict-clear-own"
    hosts = _TwoHosts(tmp_path, redis_server.location, base)
    try:
        own = _OwnClear(redis_server.location, {})
        assert l2_clear(own, hosts.link) == own.clear
        shards = _django_redis(redis_server.location, "django_redis.client.ShardClient")
        assert l2_clear(shards, hosts.link) == shards.clear
    finally:
        hosts.close()


def test_a_clear_keeps_the_ack_lists_not_yet_popped(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """An ack a host pushed for another writer's strict write survives the flush,
    with its list's remaining life (or an ack list's life, if the flush came
    between the host's ``RPUSH`` and ``PEXPIRE``). Fails before: the lists went."""
    base = "test:strict-clear-acks"
    hosts = _TwoHosts(tmp_path, redis_server.location, base)
    conn = RespConnection(parse_url(redis_server.location), 2.0)
    try:
        strict = hosts.link.publisher.strict
        assert strict is not None
        pending = f"{ack_prefix(base)}7:42:0123456789abcdef"
        unexpiring = f"{ack_prefix(base)}7:43:fedcba9876543210"
        conn.call("RPUSH", pending, "host-b:signature", "host-c:signature")
        conn.call("PEXPIRE", pending, 30_000)
        conn.call("RPUSH", unexpiring, "host-b:signature")
        conn.call("SET", "user-key", "v")
        conn.call("RPUSH", f"{base}:not-an-ack", "v")  # a list the L2 holds: flushed
        strict.flush_keeping_members()
        assert conn.call("GET", "user-key") is None
        assert conn.call("EXISTS", f"{base}:not-an-ack") == 0
        assert conn.call("LRANGE", pending, 0, -1) == [b"host-b:signature",
                                                      b"host-c:signature"]
        assert 0 < conn.call("PTTL", pending) <= 30_000
        assert conn.call("LRANGE", unexpiring, 0, -1) == [b"host-b:signature"]
        assert 0 < conn.call("PTTL", unexpiring) <= ACK_TTL_MS
        hosts.write()
    finally:
        conn.close()
        hosts.close()
