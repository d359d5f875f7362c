"""Strict writes (OPTIONS["STRICT_LEASE"]): a write returns once every live host applied it.

Against a real redis-server on loopback; simulated hosts are generation-table
directories of their own (``tests/cluster/workers.py``). The protocol and its
argument: ``djcachebench/coherence/cluster/strict.py`` and docs/architecture.md,
"Strict writes".
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.coherence import open_table
from djcachebench.coherence.cluster import link_table
from djcachebench.coherence.cluster.channels import channel_id, host_channel
from djcachebench.coherence.cluster.hostfile import open_host_file
from djcachebench.coherence.cluster.lease import Lease, ack_prefix
from djcachebench.coherence.cluster.message import decode, encode
from djcachebench.coherence.cluster.resp import RespConnection, parse_url
from djcachebench.coherence.cluster.strict import StrictWriteUnconfirmed, _done, _Member
from djcachebench.tiered.cluster import cluster_link
from djcachebench.tiered.config import read_config
from tests.cluster.workers import run_hosts

LEASE = 0.5
KEYS = (b"k" * 32,)


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _member(url: str, base: str, host_id: int) -> bytes | None:
    conn = RespConnection(parse_url(url), 2.0)
    try:
        return conn.call("GET", f"{base}:member:{channel_id(host_id).hex()}")
    finally:
        conn.close()


def test_strict_writes_leave_no_window_across_hosts(tmp_path: Path,
                                                   redis_server: RedisServer) -> None:
    """3 hosts x 2 processes, writers and readers everywhere: with a bound of 0, no
    read that starts after a write was acknowledged returns an older value, while
    the L1s serve."""
    redis_server.flush()
    results, _ = run_hosts(str(tmp_path), [redis_server.location] * 3, procs=2,
                           duration=8.0, bound=0.0, strict_lease=1.0)
    assert [v for r in results for v in r["violations"]] == []
    reads = sum(r["reads"] for r in results)
    assert reads > 3000
    for host in range(3):
        mine = [r for r in results if r["host"] == host]
        assert sum(r["stats"]["l1_hits"] for r in mine) > 0.1 * sum(r["reads"] for r in mine)
        assert sum(r["cluster"]["strict_writes"] for r in mine) > 50
        assert all(r["cluster"]["strict_unconfirmed"] == 0 for r in mine)
        assert mine[0]["cluster"]["strict_acks"] > 0


def test_without_strict_writes_the_same_check_finds_reads_in_the_window(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """The negative control: the ordinary cluster mode has a bound (0.102 s), and
    the check above, held to 0, must see it (it can fail)."""
    redis_server.flush()
    results, _ = run_hosts(str(tmp_path), [redis_server.location] * 3, procs=2,
                           duration=5.0, bound=0.0)
    assert sum(len(r["violations"]) for r in results) > 0


def _host_process(path: str, url: str, base: str, ready: Any, leave: Any,
                  lease: float = LEASE) -> None:
    """A host of one process, its subscriber (spawned); it exits normally when told to."""
    table = open_table(path, 256)
    link_table(table, url, base, strict_lease=lease, strict_keys=KEYS)
    while not table.guard():  # type: ignore[misc]
        time.sleep(0.005)
    ready.set()
    leave.wait(120)


def _wait_stopped(pid: int) -> None:
    """Until every thread of ``pid`` is stopped (state T in /proc)."""
    deadline = time.monotonic() + 30
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(state in "tT" for state in states):
            return
        assert time.monotonic() < deadline, f"pid {pid} never stopped: {states}"
        time.sleep(0.001)


class _TwoHosts:
    """Host A in this process (a table and its link), host B one spawned process
    that subscribes and holds its lease; B has acked one strict write of A's."""

    def __init__(self, tmp_path: Path, url: str, base: str) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.ready, self.leave = spawn.Event(), spawn.Event()
        b_path = str(tmp_path / "b" / "g.mmap")
        self.other = spawn.Process(target=_host_process,
                                   args=(b_path, url, base, self.ready, self.leave),
                                   daemon=True)
        self.other.start()
        self.a = open_table(str(tmp_path / "a" / "g.mmap"), 256)
        self.link = link_table(self.a, url, base, strict_lease=LEASE, strict_keys=KEYS)
        self.b_path = b_path
        try:
            assert self.ready.wait(30)
            self.b_host = open_host_file(b_path)
            self.b_id = channel_id(self.b_host.host_id).hex()
            _until(lambda: self.a.guard() and _member(url, base, self.b_host.host_id))
            self.write()  # B acks: A has seen B
            assert self.link.stats()["strict_hosts_acked"] == 1
        except BaseException:
            self.close()
            raise

    def write(self) -> float:
        """One strict write of A's; how long it took."""
        started = time.monotonic()
        self.link.strict_write(lambda: self.a.stamp("k"))
        return time.monotonic() - started

    @contextlib.contextmanager
    def b_stopped(self) -> Iterator[None]:
        os.kill(self.other.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            # kill() returns before the stop takes effect: on a loaded machine B's
            # subscriber acked a write after it (seen in CI), which is correct
            # (it applied it) but is not what the tests below are about.
            _wait_stopped(self.other.pid)  # type: ignore[arg-type]
            yield
        finally:
            os.kill(self.other.pid, signal.SIGCONT)  # type: ignore[arg-type]

    def close(self) -> None:
        self.leave.set()
        self.link.stop()
        self.other.join(10)
        if self.other.is_alive():
            self.other.kill()


def test_a_stopped_host_is_waited_for_until_its_lease_expires_then_skipped(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """SIGSTOP of host B's only process: A's strict write waits at most about one
    lease, and returns only after B stopped serving L1 hits; once B runs again it
    resubscribes (a new incarnation, an epoch bump) and acks again."""
    base = "test:strict-stop"
    hosts = _TwoHosts(tmp_path, redis_server.location, base)
    try:
        b_guard = hosts.b_host.guard()
        with hosts.b_stopped():
            waited = hosts.write()
            assert not b_guard()  # B serves no L1 hit by the time A's write returns
            assert waited <= LEASE + 0.5
            assert hosts.link.stats()["strict_hosts_excluded"] == 1
        before = open_host_file(hosts.b_path).stats()["epoch_bumps"]
        _until(lambda: b_guard() and open_host_file(hosts.b_path).stats()["epoch_bumps"] > before)
        acked = hosts.link.stats()["strict_hosts_acked"]
        _until(lambda: _member(redis_server.location, base, hosts.b_host.host_id) is not None)
        hosts.write()
        assert hosts.link.stats()["strict_hosts_acked"] == acked + 1
    finally:
        hosts.close()


def _forge_acks(url: str, base: str, host: str, stop: threading.Event) -> None:
    """A party that can subscribe and write the redis (not SECRET_KEY): it reads
    every strict write's ack key and pushes ``host``'s id onto it."""
    conn = RespConnection(parse_url(url), 0.05)
    try:
        conn.call("PSUBSCRIBE", f"{base}:*")
        while not stop.is_set():
            try:
                item = conn.reply()
            except OSError:
                continue
            msg = decode(item[3]) if item[0] == b"pmessage" else None
            if msg is not None and msg.ack is not None:
                pusher = RespConnection(parse_url(url), 2.0)
                pusher.call("RPUSH", msg.ack, f"{host}:{'0' * 32}", host)
                pusher.close()
    finally:
        conn.close()


def test_forged_acks_and_a_deleted_lease_do_not_cut_a_wait_short(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Acks must not be host ids anyone can push, nor may a deleted member key end
    the wait. B is stopped: A's write must still wait out B's lease, and return
    only after B stopped serving."""
    base = "test:strict-forge"
    url = redis_server.location
    hosts = _TwoHosts(tmp_path, url, base)
    stop = threading.Event()
    forger = threading.Thread(target=_forge_acks, daemon=True,
                              args=(url, base, hosts.b_id, stop))
    try:
        b_guard = hosts.b_host.guard()
        with hosts.b_stopped():
            conn = RespConnection(parse_url(url), 2.0)
            conn.call("DEL", f"{base}:member:{hosts.b_id}")
            conn.call("SREM", f"{base}:members", hosts.b_id)
            conn.close()
            forger.start()
            time.sleep(0.1)  # the forger is listening
            waited = hosts.write()
            assert not b_guard()  # B serves nothing by the time A's write returns
            assert 0.15 <= waited <= LEASE + 0.5
    finally:
        stop.set()
        if forger.is_alive():
            forger.join(5)
        hosts.close()


def test_an_ack_counts_only_for_the_message_it_names() -> None:
    from djcachebench.coherence.cluster.lease import mac, verifies

    signed = mac(KEYS[0], b"ack", b"host", b"ackkey", b"the message").encode()
    assert verifies(KEYS, signed, b"ack", b"host", b"ackkey", b"the message")
    assert not verifies(KEYS, signed, b"ack", b"host", b"ackkey", b"a forged message")
    assert not verifies(KEYS, signed, b"ack", b"other", b"ackkey", b"the message")
    assert not verifies((b"j" * 32,), signed, b"ack", b"host", b"ackkey", b"the message")


def test_a_host_that_renews_its_lease_but_never_acks_makes_the_write_raise(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """A strict write cannot be acknowledged without every live host: it raises once
    its time is up (2 leases + 1 s), and its stamps still go out the ordinary way."""
    base = "test:strict-mute"
    conn = RespConnection(parse_url(redis_server.location), 2.0)
    mute = "ab" * 6  # a member that never acks
    a = open_table(str(tmp_path / "a" / "g.mmap"), 256)
    link = link_table(a, redis_server.location, base, strict_lease=0.05, strict_keys=KEYS)
    try:
        conn.call("SET", f"{base}:member:{mute}", Lease(base, mute, 60, KEYS[0]).value(7, True),
                  "PX", 60_000)
        conn.call("SADD", f"{base}:members", mute)
        _until(lambda: a.guard())
        started = time.monotonic()
        with pytest.raises(StrictWriteUnconfirmed):
            link.strict_write(lambda: a.stamp("k"))
        assert 1.0 <= time.monotonic() - started <= 3.0
        assert link.stats()["strict_unconfirmed"] == 1
        _until(lambda: link.stats()["messages_sent"] >= 1)  # and as an ordinary message
    finally:
        conn.close()
        link.stop()


def test_a_subscriber_pushes_acks_onto_ack_keys_only(tmp_path: Path,
                                                     redis_server: RedisServer) -> None:
    """Whoever can PUBLISH could otherwise make every host RPUSH onto any key."""
    base = "test:strict-acks"
    table = open_table(str(tmp_path / "g.mmap"), 256)
    link = link_table(table, redis_server.location, base, strict_lease=LEASE, strict_keys=KEYS)
    conn = RespConnection(parse_url(redis_server.location), 2.0)
    try:
        _until(lambda: table.guard())
        channel = host_channel(base, 1)
        conn.call("PUBLISH", channel, encode(1, 5, 1, time.time_ns(), ["x"], "victim"))
        good = ack_prefix(base) + "5:2"
        conn.call("PUBLISH", channel, encode(1, 5, 2, time.time_ns(), ["x"], good))
        _until(lambda: conn.call("LLEN", good) == 1)
        assert conn.call("LLEN", "victim") == 0
        own = channel_id(link.host.host_id).hex()  # type: ignore[union-attr]
        assert conn.call("LPOP", good).decode().split(":")[0] == own
    finally:
        conn.close()
        link.stop()


def test_a_host_whose_host_file_cannot_be_opened_still_publishes(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Its own L1 stays off; until this was fixed its writes were not published at
    all, and the other hosts' L1s kept serving what it had overwritten."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "g.mmap.cluster").mkdir()  # not a file: cannot be opened
    a = open_table(str(tmp_path / "a" / "g.mmap"), 256)
    b = open_table(str(tmp_path / "b" / "g.mmap"), 256)
    link_a = link_table(a, redis_server.location, "test:nofile")
    link_b = link_table(b, redis_server.location, "test:nofile")
    try:
        _until(lambda: b.guard())
        assert not a.guard()  # type: ignore[misc]
        held = b.token("k")
        a.stamp("k")
        link_a.flush()
        _until(lambda: not b.is_current(None, held))
    finally:
        link_a.stop()
        link_b.stop()


def test_when_a_host_is_done_with_a_write() -> None:
    ready1, ready2 = _Member(b"1", True), _Member(b"2", True)
    joining1, joining2 = _Member(b"1", False), _Member(b"2", False)
    assert _done(ready1, ready2, now=5.0, until=9.0)  # resubscribed and bumped since
    assert _done(joining1, ready2, now=5.0, until=9.0)
    assert not _done(ready1, ready1, now=5.0, until=9.0)
    assert not _done(ready1, joining2, now=5.0, until=9.0)  # registered, not bumped yet
    assert not _done(joining1, ready1, now=5.0, until=9.0)  # the same subscription: it acks
    assert not _done(None, ready2, now=5.0, until=9.0)  # only remembered: its ack, or time
    # Gone (expired, deleted, or rewritten without the key): only once its lease would
    # have ended, so that deleting the key cannot cut the wait short.
    assert not _done(ready1, None, now=5.0, until=9.0)
    assert _done(ready1, None, now=9.0, until=9.0)
    # Left (a clean stop gave the lease back): done at once, but only for the
    # incarnation this process saw live last; an old incarnation's "leaving" put
    # back over a newer one's lease waits like a deleted key.
    leaving1 = _Member(b"1", True, leaving=True)
    assert _done(ready1, leaving1, now=5.0, until=9.0, seen=b"1")
    assert _done(None, leaving1, now=5.0, until=9.0, seen=None)
    assert not _done(ready2, leaving1, now=5.0, until=9.0, seen=b"2")
    assert _done(ready2, leaving1, now=9.0, until=9.0, seen=b"2")


def test_a_host_that_exits_cleanly_does_not_stall_strict_writes(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Its subscriber gives the lease back at exit, after its host stopped serving:
    a strict write then returns without waiting the lease out (it waited the whole
    lease before)."""
    base, lease, url = "test:strict-exit", 5.0, redis_server.location
    spawn = multiprocessing.get_context("spawn")
    ready, leave = spawn.Event(), spawn.Event()
    b = spawn.Process(target=_host_process, daemon=True,
                      args=(str(tmp_path / "b" / "g.mmap"), url, base, ready, leave, lease))
    b.start()
    a = open_table(str(tmp_path / "a" / "g.mmap"), 256)
    link = link_table(a, url, base, strict_lease=lease, strict_keys=KEYS)
    try:
        assert ready.wait(30)
        b_id = open_host_file(str(tmp_path / "b" / "g.mmap")).host_id
        _until(lambda: a.guard() and _member(url, base, b_id))
        link.strict_write(lambda: a.stamp("k"))
        assert link.stats()["strict_hosts_acked"] == 1  # A waits for B
        leave.set()
        b.join(10)
        assert b.exitcode == 0
        value = _member(url, base, b_id)
        assert value is not None and value.split(b":")[1] == b"leaving"
        started = time.monotonic()
        link.strict_write(lambda: a.stamp("k"))
        assert time.monotonic() - started < lease / 2
        assert link.stats()["strict_hosts_excluded"] == 1
    finally:
        leave.set()
        link.stop()
        if b.is_alive():
            b.kill()


def test_a_host_gives_its_lease_back_only_after_it_stopped_serving(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Two hosts in this process: when B's subscriber stops, its guard fails before
    its member value says it left, so a write that returns because B left finds B
    serving nothing."""
    base, lease, url = "test:strict-withdraw", 5.0, redis_server.location
    a = open_table(str(tmp_path / "a" / "g.mmap"), 256)
    b = open_table(str(tmp_path / "b" / "g.mmap"), 256)
    link_a = link_table(a, url, base, strict_lease=lease, strict_keys=KEYS)
    link_b = link_table(b, url, base, strict_lease=lease, strict_keys=KEYS)
    try:
        _until(lambda: a.guard() and b.guard())
        link_a.strict_write(lambda: a.stamp("k"))
        b_host = link_b.host.host_id  # type: ignore[union-attr]
        link_b.stop()
        assert not b.guard()  # type: ignore[misc]
        started = time.monotonic()
        link_a.strict_write(lambda: a.stamp("k"))
        assert time.monotonic() - started < lease / 2
        assert not b.guard()  # type: ignore[misc]
        assert _member(url, base, b_host).split(b":")[1] == b"leaving"  # type: ignore[union-attr]
    finally:
        link_a.stop()
        link_b.stop()


def test_a_message_carries_its_ack_key_and_old_messages_still_read() -> None:
    old = decode(encode(1, 2, 3, 4, ["k"]))
    assert old is not None and old.ack is None and old.keys == ["k"]
    new = decode(encode(1, 2, 3, 4, None, "base:ack:2:3"))
    assert new is not None and new.ack == "base:ack:2:3" and new.keys is None
    assert decode(b'[1,2,3,4,["k"],5]') is None  # an ack key that is not a string
    assert decode(b'"12345"') is None and decode(b'[1,2,3,4,null,"a","b"]') is None


REDIS = {"BACKEND": "django.core.cache.backends.redis.RedisCache"}


def _leave(cache: TieredCache) -> None:
    """Stop the cache's subscriber: its lease renewals would go on reaching the
    session's redis-server (tests that watch its commands count them)."""
    link = cluster_link(cache.generation_table)
    assert link is not None
    link.stop()


def test_the_setting_is_checked() -> None:
    l2 = {**REDIS, "LOCATION": "redis://127.0.0.1:6390/0"}
    assert read_config("", {"OPTIONS": {"L2": l2, "COHERENCE": "cluster",
                                        "STRICT_LEASE": 2}}).strict_lease == 2.0
    assert read_config("", {"OPTIONS": {"L2": l2, "COHERENCE": "cluster"}}).strict_lease is None
    with pytest.raises(ImproperlyConfigured, match=r"\['STRICT_LEASE'\] = 1.0 is invalid with "
                                                   r"COHERENCE='host'"):
        read_config("", {"OPTIONS": {"L2": l2, "STRICT_LEASE": 1.0}})
    for bad in (0.01, 0, -1, "1", float("nan"), True, 7200):
        with pytest.raises(ImproperlyConfigured, match="STRICT_LEASE"):
            read_config("", {"OPTIONS": {"L2": l2, "COHERENCE": "cluster",
                                         "STRICT_LEASE": bad}})


def test_a_tiered_cache_writes_strictly_and_a_refused_add_waits_for_nothing(
        tmp_path: Path, redis_server: RedisServer) -> None:
    redis_server.flush()
    cache = TieredCache("", {"OPTIONS": {
        "L2": {**REDIS, "LOCATION": redis_server.location}, "COHERENCE": "cluster",
        "STRICT_LEASE": LEASE, "GENERATION_PATH": str(tmp_path / "g.mmap")}})
    _until(lambda: cache.stats()["cluster_host_fresh"])
    cache.set("k", "v")
    assert cache.add("k", "other") is False
    cache.delete_many(["k", "j"])
    cache.clear()
    stats = cache.stats()
    assert stats["cluster_strict_writes"] == 3  # set, delete_many, clear: not the add
    assert stats["cluster_strict_unconfirmed"] == 0
    assert cache.get("k") is None
    _leave(cache)


def test_two_aliases_on_one_table_must_agree_on_strict_writes(
        tmp_path: Path, redis_server: RedisServer) -> None:
    def alias(**options: Any) -> TieredCache:
        return TieredCache("", {"OPTIONS": {
            "L2": {**REDIS, "LOCATION": redis_server.location}, "COHERENCE": "cluster",
            "GENERATION_PATH": str(tmp_path / "g.mmap"), **options}})

    first = alias(STRICT_LEASE=LEASE)
    try:
        alias(STRICT_LEASE=LEASE)
        with pytest.raises(ImproperlyConfigured, match="STRICT_LEASE"):
            alias()
    finally:
        _leave(first)


def test_clearing_a_redis_l2_that_holds_the_leases_keeps_them(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """TieredCache's clear() over Django's RedisCache on the COHERENCE_URL's
    database must not send FLUSHDB, which takes the hosts' leases with it: a writer
    process that had not seen host B would then wait for nobody, and B, stopped
    meanwhile, serve the values the strict writes after the clear replaced. The
    clear flushes in one script that keeps every live lease as it was."""
    from django.core.cache.backends.redis import RedisCache

    from djcachebench.tiered.cluster import l2_clear

    base = "test:strict-clear"
    hosts = _TwoHosts(tmp_path, redis_server.location, base)
    try:
        l2 = RedisCache(redis_server.location, {})
        clear = l2_clear(l2, hosts.link)
        l2.set("user-key", "v")
        lease = _member(redis_server.location, base, hosts.b_host.host_id)
        assert lease is not None
        clear()
        assert l2.get("user-key") is None  # the L2 is empty, as its own clear leaves it
        assert _member(redis_server.location, base, hosts.b_host.host_id) == lease
        conn = RespConnection(parse_url(redis_server.location), 2.0)
        try:
            assert conn.call("PTTL", f"{base}:member:{hosts.b_id}") > 0
            assert conn.call("SISMEMBER", f"{base}:members", hosts.b_id) == 1
        finally:
            conn.close()
        hosts.write()  # B still acks
        # Another database holds no lease: its own clear, which leaves them be.
        other = RedisCache(redis_server.location.rsplit("/", 1)[0] + "/1", {})
        assert l2_clear(other, hosts.link) == other.clear
        assert l2_clear(l2, None) == l2.clear
        # The same server spelled another way (here localhost for 127.0.0.1; a
        # unix socket likewise) keeps the leases too.
        alias = RedisCache(redis_server.location.replace("127.0.0.1", "localhost"), {})
        alias.set("user-key", "v")
        l2_clear(alias, hosts.link)()
        assert alias.get("user-key") is None
        assert _member(redis_server.location, base, hosts.b_host.host_id) == lease
        # And another server on its database 0 is cleared, not the leases' one.
        with RedisServer() as elsewhere:
            third = RedisCache(elsewhere.location, {})
            third.set("their-key", "v")
            l2.set("user-key", "kept")
            l2_clear(third, hosts.link)()
            assert third.get("their-key") is None and l2.get("user-key") == "kept"
        hosts.write()
    finally:
        hosts.close()
