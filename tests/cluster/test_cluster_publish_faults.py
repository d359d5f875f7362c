"""COHERENCE='cluster': a write whose invalidation did not reach redis is not
acknowledged.

Under ``CLIENT PAUSE ... WRITE`` (the usual step of a manual failover, and what
redis's ``FAILOVER`` does), a write whose L2 command ran before the pause has its
``PUBLISH`` blocked; the publisher retries, then drops the message. ``PING`` is
not a write, so the other hosts' subscribers stay fresh and their L1s would
serve the replaced value until the pause ends if the write returned as usual.
Such a write raises ``PublicationDropped`` (its L2 write stands).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.coherence.cluster.publisher import PublicationDropped
from djcachebench.coherence.cluster.resp import RespConnection, parse_url
from djcachebench.coherence.cluster.strict import WriteUnconfirmed
from djcachebench.tiered.cluster import cluster_link

DJANGO_REDIS = "django.core.cache.backends.redis.RedisCache"


def _host(tmp_path: Path, location: str) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": DJANGO_REDIS, "LOCATION": location}, "COHERENCE": "cluster",
        "GENERATION_PATH": str(tmp_path / "a" / "generations.mmap")}})


def _until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


@pytest.mark.servers
@pytest.mark.parametrize("write", ["delete", "add", "incr", "set_many", "delete_many", "touch"])
def test_a_write_whose_publish_is_dropped_raises_and_stays_written(
        tmp_path: Path, redis_server: RedisServer, write: str) -> None:
    cache = _host(tmp_path, redis_server.location)
    link = cluster_link(cache.generation_table)
    assert link is not None and link.publisher is not None
    link.publisher.give_up_after = 0.5
    admin = RespConnection(parse_url(redis_server.location), 5.0)
    try:
        _until(cache.generation_table.serving)
        cache.set("k", 1)
        l2 = cache.l2
        original = getattr(l2, write)

        def then_pause(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            # Writes pause right after this L2 write: its PUBLISH waits out the
            # publisher's give_up_after.
            assert admin.call("CLIENT", "PAUSE", 1500, "WRITE") == b"OK"
            return result

        setattr(l2, write, then_pause)
        calls = {"delete": lambda: cache.delete("k"), "add": lambda: cache.add("new", 2),
                 "incr": lambda: cache.incr("k"), "set_many": lambda: cache.set_many({"k": 3}),
                 "delete_many": lambda: cache.delete_many(["k"]),
                 "touch": lambda: cache.touch("k", 300)}
        with pytest.raises(PublicationDropped) as raised:
            calls[write]()
        assert isinstance(raised.value, WriteUnconfirmed)
        assert link.publisher.stats()["messages_dropped"] >= 1
        setattr(l2, write, original)
        admin.call("CLIENT", "UNPAUSE")
        # The L2 write stood; the next writes are acknowledged as usual.
        expected = {"delete": None, "add": 1, "incr": 2, "set_many": 3, "delete_many": None,
                    "touch": 1}[write]
        assert l2.get("k") == expected
        cache.set("k", 5)
        assert cache.get("k") == 5
    finally:
        admin.call("CLIENT", "UNPAUSE")
        admin.close()
        link.stop()


def test_a_host_listed_by_none_is_done_once_ready_under_a_new_incarnation() -> None:
    """After a redis restart without persistence no member is listed when a strict
    write begins; a host this writer remembers (incarnation ``old``) comes back
    ready under a new incarnation that never saw the write's message, so waiting
    for it is waiting on nothing: the first strict write after the restart would
    block 2 x STRICT_LEASE + 1 s and raise (as with a redis-server restarted under
    two hosts). A new ready incarnation that resubscribed and bumped its epoch
    after the write began counts as done."""
    from djcachebench.coherence.cluster.strict import _done, _Member

    now, until = 100.0, 103.0  # the remembered lease may run 3 s more
    back = _Member(b"new", ready=True)
    assert _done(None, back, now, until, seen=b"new", remembered=b"old")
    # Still the incarnation it had: it must ack (or its lease end).
    assert not _done(None, _Member(b"old", ready=True), now, until, b"old", b"old")
    assert not _done(None, _Member(b"new", ready=False), now, until, b"new", b"old")
    # Listed when the write began: unchanged.
    assert _done(_Member(b"old", True), back, now, until, b"new")
    assert not _done(_Member(b"new", True), back, now, until, b"new")
    assert _done(None, None, until, until, None, b"old")  # gone: at its lease's end


def test_a_lease_that_does_not_verify_is_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """A host with another ``SECRET_KEY`` holds a lease no other host can verify;
    strict writes rightly do not wait for it, while that host's L1s serve values
    strict writes replaced, so it must not pass silently: it is counted
    (``strict_hosts_unverified``) and logged."""
    from djcachebench.coherence.cluster import strict

    monkey = pytest.MonkeyPatch()
    monkey.setitem(strict._UNVERIFIED, "logged_at", -float("inf"))
    try:
        before = strict.strict_unverified()
        reply = [b"abc123", b"incarnation:ready:" + b"0" * 64, 1000]
        with caplog.at_level("ERROR", logger="djcachebench.coherence.cluster"):
            listed = strict._members(reply, (b"k" * 32,), 0.0, {}, {})
        assert listed == {}
        assert strict.strict_unverified() == before + 1
        assert "abc123" in caplog.text and "SECRET_KEY" in caplog.text
    finally:
        monkey.undo()


def test_a_copied_host_file_is_another_host(tmp_path: Path) -> None:
    """A host directory copied with its host file (a cloned VM or container image,
    a restored backup) must not give two hosts one id: each would exclude the
    other's channel as its own and never hear its writes (its L1s serving
    replaced values until L1_TIMEOUT), and strict writes would skip the twin. A
    host's id includes its file's identity."""
    import shutil

    from djcachebench.coherence.cluster.hostfile import open_host_file

    (tmp_path / "a").mkdir()
    first = open_host_file(str(tmp_path / "a" / "generations.mmap"))
    again = open_host_file(str(tmp_path / "a" / "generations.mmap"))
    assert first.host_id == again.host_id  # every process of one host agrees
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    twin = open_host_file(str(tmp_path / "b" / "generations.mmap"))
    assert twin.host_id != first.host_id
