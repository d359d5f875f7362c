"""COHERENCE='cluster' over the redis of the invalidations: a set carries its
PUBLISH in its own round trip (``djcachebench.tiered.inline``).

Observed with redis's ``MONITOR`` on a real redis-server: each set's ``SET`` and
``PUBLISH`` come from the same client connection, one right after the other.
Before the pipeline, the ``PUBLISH`` came from the publisher's own connection
after the ``SET`` had been answered: a second round trip for every write.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.coherence.cluster.resp import RespConnection, parse_url
from djcachebench.tiered.cluster import cluster_link

DJANGO_REDIS = "django.core.cache.backends.redis.RedisCache"
DJANGO_REDIS_PKG = "django_redis.cache.RedisCache"

_LINE = re.compile(rb'^[\d.]+ \[\d+ ([^\]]+)\] "(\w+)"')


class Monitor:
    """The commands redis runs, as (client address, command) pairs, in order."""

    def __init__(self, location: str) -> None:
        self.conn = RespConnection(parse_url(location), 5.0)
        assert self.conn.call("MONITOR") == b"OK"
        self.seen: list[tuple[bytes, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.conn.settimeout(0.05)
        while not self._stop.is_set():
            try:
                line = self.conn.reply()
            except (TimeoutError, OSError):
                continue
            found = _LINE.match(line) if isinstance(line, bytes) else None
            if found:
                self.seen.append((found.group(1), found.group(2).upper()))

    def stop(self) -> list[tuple[bytes, bytes]]:
        self._stop.set()
        self._thread.join()
        self.conn.close()
        return self.seen


def _host(tmp_path: Path, name: str, l2: dict[str, Any], **options: Any) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": l2, "COHERENCE": "cluster",
        "GENERATION_PATH": str(tmp_path / name / "generations.mmap"),
        "L1_MAX_ENTRIES": 100 + len(name), **options}})


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _writes(seen: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(client, cmd) for client, cmd in seen if cmd in (b"SET", b"PUBLISH")]


@pytest.mark.parametrize("backend", [DJANGO_REDIS, DJANGO_REDIS_PKG])
def test_a_set_publishes_with_its_write(tmp_path: Path, redis_server: RedisServer,
                                        backend: str) -> None:
    l2 = {"BACKEND": backend, "LOCATION": redis_server.location}
    a, b = _host(tmp_path, "a", l2), _host(tmp_path, "bb", l2)
    links = [cluster_link(c.generation_table) for c in (a, b)]
    try:
        _until(lambda: all(c.generation_table.serving() for c in (a, b)))
        a.set("k", "v0")
        _until(lambda: b.get("k") == "v0" and b.get("k") == "v0" and b.stats()["l1_hits"] >= 1)
        sent = a.stats()["cluster_invalidations_sent"]
        monitor = Monitor(redis_server.location)
        time.sleep(0.1)  # MONITOR is on
        for i in range(1, 6):
            a.set("k", f"v{i}")
            _until(lambda i=i: b.get("k") == f"v{i}", timeout=2.0)  # B's L1 copy ended
        time.sleep(0.1)
        seen = _writes(monitor.stop())
        assert len(seen) == 10, seen
        for (set_client, first), (pub_client, second) in zip(seen[::2], seen[1::2], strict=True):
            assert (first, second) == (b"SET", b"PUBLISH")
            assert set_client == pub_client  # the same connection: one pipeline
        assert a.stats()["cluster_invalidations_sent"] == sent + 5
        assert b.stats()["cluster_invalidations_applied"] >= 5
    finally:
        for link in links:
            link.stop()  # type: ignore[union-attr]


def test_another_redis_for_invalidations_publishes_apart(
        tmp_path: Path, redis_server: RedisServer) -> None:
    with RedisServer() as other:
        l2 = {"BACKEND": DJANGO_REDIS, "LOCATION": redis_server.location}
        a = _host(tmp_path, "a", l2, COHERENCE_URL=other.location)
        link = cluster_link(a.generation_table)
        try:
            _until(a.generation_table.serving)
            on_l2, on_other = Monitor(redis_server.location), Monitor(other.location)
            time.sleep(0.1)
            for i in range(3):
                a.set("k", i)
            time.sleep(0.1)
            assert _writes(on_l2.stop()) == [(c, b"SET") for c, _ in _writes(on_l2.seen)]
            assert len(_writes(on_l2.seen)) == 3
            assert [cmd for _, cmd in _writes(on_other.stop())] == [b"PUBLISH"] * 3
        finally:
            link.stop()  # type: ignore[union-attr]


@pytest.mark.servers
def test_a_set_while_redis_is_down_raises_and_is_published_later(
        tmp_path: Path) -> None:
    """The pipeline fails, the L2's own set runs (and raises, as Django's RedisCache
    does), and the key goes through the publisher's queue like any failed write's:
    nothing is marked as published that was not."""
    with RedisServer() as server:
        l2 = {"BACKEND": DJANGO_REDIS, "LOCATION": server.location}
        a = _host(tmp_path, "a", l2)
        link = cluster_link(a.generation_table)
        assert link is not None and link.publisher is not None
        try:
            _until(a.generation_table.serving)
            a.set("k", 1)
            sent = link.publisher.stats()["invalidations_sent"]
            server.stop()
            with pytest.raises(Exception):  # noqa: B017 (redis-py's ConnectionError)
                a.set("k", 2)
            assert link.publisher.stats()["invalidations_sent"] == sent
            assert link.publisher.stats()["messages_dropped"] >= 1  # queued, then dropped
        finally:
            link.stop()



@pytest.mark.parametrize("coherence", ["cluster", "host"])
@pytest.mark.parametrize("backend", [DJANGO_REDIS, DJANGO_REDIS_PKG])
def test_the_inline_set_stores_what_the_backends_own_set_stores(
        tmp_path: Path, redis_server: RedisServer, backend: str, coherence: str) -> None:
    """Bytes, expiry and the answer, compared with the L2's own ``set`` of the
    same value and timeout under another key (with the PUBLISH in the send, and
    without: COHERENCE='host' sends the write alone, the same lean way).
    django-redis answers True for a stored value and, for a timeout that
    deletes, whether a key went; Django's RedisCache answers None."""
    from django.core.cache.backends.base import DEFAULT_TIMEOUT

    l2 = {"BACKEND": backend, "LOCATION": redis_server.location, "TIMEOUT": 120}
    a = _host(tmp_path, "a", l2, COHERENCE=coherence)
    link = cluster_link(a.generation_table)
    raw = RespConnection(parse_url(redis_server.location), 5.0)
    try:
        if link is not None:
            _until(a.generation_table.serving)
        cases = [("bytes", b"\x00\xff", 30), ("str", "é" * 50, 30.5), ("int", 7, 30),
                 ("bool", True, 30), ("dict", {"a": [1, 2]}, None),
                 ("default", 1.5, DEFAULT_TIMEOUT), ("zero", "gone", 0), ("negative", "gone", -5),
                 ("zero-held", "gone", 0)]
        for name, value, timeout in cases:
            if name == "zero-held":  # a key there to delete: django-redis answers True
                a.l2.set(f"{name}-own", 1, 30)
                a.l2.set(f"{name}-inline", 1, 30)
            answers = (a.l2.set(f"{name}-own", value, timeout),
                       a.set(f"{name}-inline", value, timeout))
            assert answers[1] == answers[0], (name, answers)
            assert answers[0] is (None if backend == DJANGO_REDIS
                                  else name not in ("zero", "negative")), (name, answers)
            own, inline = (a.l2.make_key(f"{name}-{w}") for w in ("own", "inline"))
            assert raw.call("GET", inline) == raw.call("GET", own), name
            ttl_own, ttl_inline = raw.call("PTTL", own), raw.call("PTTL", inline)
            assert (ttl_own < 0) == (ttl_inline < 0) and abs(ttl_own - ttl_inline) < 2000, name
            expected = None if timeout == 0 or (timeout is not None and timeout is not
                                                DEFAULT_TIMEOUT and timeout < 0) else value
            assert a.get(f"{name}-inline") == expected == a.l2.get(f"{name}-inline"), name
    finally:
        raw.close()
        if link is not None:
            link.stop()


def test_a_tiered_cache_over_another_l2_does_not_import_django_redis(tmp_path: Path) -> None:
    """Looking for a lean send, TieredCache imported django-redis (and with it
    redis-py and its asyncio client) whatever its L2: tens of milliseconds added
    to the first request of every worker process over ShardedSQLiteCache. Fails
    before: django_redis was in ``sys.modules`` after the first write."""
    import subprocess
    import sys

    script = f"""
import sys
import django
from django.conf import settings
settings.configure(SECRET_KEY="s" * 50, CACHES={{
    "disk": {{"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
              "LOCATION": {str(tmp_path / "disk")!r}}},
    "default": {{"BACKEND": "djcachebench.backends.tiered.TieredCache",
                 "OPTIONS": {{"L2": "disk"}}}}}})
django.setup()
from django.core.cache import cache
cache.set("k", {{"a": 1}})
assert cache.get("k") == {{"a": 1}}
print(sorted(m for m in sys.modules if m.partition(".")[0] in ("django_redis", "redis")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
