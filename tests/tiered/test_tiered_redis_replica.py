"""TieredCache over redis with a read replica: what the L1 keeps comes from the primary.

The L1 must not fill itself through the backend's read client, which is a
replica when LOCATION lists one. Replication is asynchronous: a replica that
has not applied an acknowledged write yet gives the older value, which the L1
would keep under the token taken after the write, and serve until L1_TIMEOUT
(60 s by default), long after the replica caught up. The backend alone returns
the older value only while the replica lags.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer

PAD = "p" * 2000  # above SHARED_VALUE_BYTES: the reader goes to the L2, not the board


@pytest.fixture(scope="module")
def replica(redis_server: Any) -> Any:
    """A second redis-server, replica of the session's."""
    server = RedisServer()
    server.start()
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        client.replicaof("127.0.0.1", redis_server.port)
        deadline = time.monotonic() + 30
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never caught up with its primary"
            time.sleep(0.05)
        yield server, client
    finally:
        server.stop()


def _wait_replicated(replica: redis.Redis, primary: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while replica.info("replication")["slave_repl_offset"] < primary.info(
            "replication")["master_repl_offset"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("backend", ["django_redis.cache.RedisCache",
                                     "django.core.cache.backends.redis.RedisCache"])
@pytest.mark.parametrize("read", ["get", "get_many"])
def test_a_value_a_lagging_replica_returns_is_not_kept_in_the_l1(
        redis_server: Any, replica: Any, tmp_path: Path, backend: str, read: str) -> None:
    server, replica_client = replica
    primary = redis.Redis(host="127.0.0.1", port=redis_server.port)
    locations = [f"redis://127.0.0.1:{redis_server.port}/5",
                 f"redis://127.0.0.1:{server.port}/5"]
    options: dict[str, Any] = {"L2": {"BACKEND": backend, "LOCATION": locations},
                               "GENERATION_PATH": str(tmp_path / "g.mmap")}
    reader = TieredCache("", {"OPTIONS": options})
    # Same table, another L1 (its options differ): like another process.
    writer = TieredCache("", {"OPTIONS": {**options, "L1_MAX_ENTRIES": 999}})

    def get(key: str) -> Any:
        return reader.get(key) if read == "get" else reader.get_many([key]).get(key)

    pinned = []
    for i in range(6):
        key = f"{read}-{i}"
        reader.set(key, ("old", PAD))
        _wait_replicated(replica_client, primary)
        assert get(key)[0] == "old"
        assert get(key)[0] == "old"
        replica_client.execute_command("CLIENT", "PAUSE", 150, "WRITE")  # replication lags
        writer.set(key, ("new", PAD))  # acknowledged by the primary
        get(key)  # may be old while the replica lags, as with the backend alone
        time.sleep(0.4)  # the replica has caught up long since
        _wait_replicated(replica_client, primary)
        if get(key)[0] != "new":
            pinned.append(key)
    assert pinned == [], f"the L1 kept a lagging replica's value for {pinned}"


@pytest.mark.parametrize("client", ["django_redis.client.HerdClient",
                                    "django_redis.client.DefaultClient"])
def test_values_read_through_other_django_redis_clients_are_the_clients_own(
        redis_server: Any, tmp_path: Path, client: str) -> None:
    """Only DefaultClient is read raw: an L1 reader that sends GET/PTTL itself and
    decodes with the client's ``decode`` does not get what HerdClient's ``get``
    returns (it stores ``(marker, value, herd timeout)`` and unpacks it), and the
    tuple would come back as the value."""
    redis_server.flush()
    l2 = {"BACKEND": "django_redis.cache.RedisCache",
          "LOCATION": f"redis://127.0.0.1:{redis_server.port}/6",
          "OPTIONS": {"CLIENT_CLASS": client}}
    from django_redis.cache import RedisCache as DjangoRedisCache

    direct = DjangoRedisCache(l2["LOCATION"], {"OPTIONS": l2["OPTIONS"]})
    direct.set("a", "value-a", 300)
    direct.set_many({"b": [1, 2], "c": 3}, 300)
    tiered = TieredCache("", {"OPTIONS": {"L2": l2, "GENERATION_PATH": str(tmp_path / "g")}})
    for _ in range(2):  # a miss that fills, then whatever the L1 keeps
        assert tiered.get("a") == "value-a"
        assert tiered.get_many(["b", "c"]) == {"b": [1, 2], "c": 3}


def test_what_the_l2_returns_from_set_and_delete_many_comes_back(
        redis_server: Any, tmp_path: Path) -> None:
    """django-redis answers ``delete_many`` with a count, diskcache ``set`` with
    True; TieredCache over them answers the same, not None. (A set to redis sent
    the lean way, ``tiered/inline.py``, is checked in ``test_cluster_inline.py``.)"""
    redis_server.flush()
    l2 = {"BACKEND": "django_redis.cache.RedisCache",
          "LOCATION": f"redis://127.0.0.1:{redis_server.port}/6"}
    tiered = TieredCache("", {"OPTIONS": {"L2": l2, "GENERATION_PATH": str(tmp_path / "g")}})
    tiered.set("a", 1)
    tiered.set("b", 2)
    assert tiered.delete_many(["a", "b", "c"]) == 2
    assert tiered.get_many(["a", "b"]) == {}
    disk = {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(tmp_path / "diskcache")}
    tiered = TieredCache("", {"OPTIONS": {"L2": disk, "GENERATION_PATH": str(tmp_path / "h")}})
    assert tiered.set("a", 1) is True
    assert tiered.get("a") == 1
