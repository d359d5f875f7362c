"""Behaviour of djcachebench.bench.servers: the one place that starts servers."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from djcachebench.bench.servers import (
    MemcachedServer,
    RedisServer,
    ServerNotInstalled,
    ServerUnavailable,
    free_port,
)


def _send(host: str, port: int, payload: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


@pytest.mark.servers
def test_memcached_fixture_serves_on_loopback(memcached_server: MemcachedServer) -> None:
    assert memcached_server.host == "127.0.0.1"
    assert memcached_server.location == f"127.0.0.1:{memcached_server.port}"
    assert _send(memcached_server.host, memcached_server.port, b"set k 0 0 1\r\nv\r\n") == (
        b"STORED\r\n"
    )
    assert _send(memcached_server.host, memcached_server.port, b"get k\r\n").startswith(
        b"VALUE k 0 1\r\nv\r\n"
    )
    memcached_server.flush()
    assert _send(memcached_server.host, memcached_server.port, b"get k\r\n") == b"END\r\n"


@pytest.mark.servers
def test_redis_fixture_serves_with_persistence_off(redis_server: RedisServer) -> None:
    import redis

    assert redis_server.location == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis.Redis.from_url(redis_server.location)
    try:
        assert client.ping()
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.set("k", b"v")
        redis_server.flush()
        assert client.get("k") is None
    finally:
        client.close()


@pytest.mark.servers
def test_context_manager_stops_the_process_by_pid() -> None:
    try:
        server = RedisServer().start()
    except ServerNotInstalled as exc:
        pytest.skip(str(exc))
    with server:
        pid = server.pid
        assert pid is not None and server.ping()
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.stop()  # idempotent


def test_missing_binary_is_a_clear_not_installed_error() -> None:
    with pytest.raises(ServerNotInstalled, match=r"redis-server-nope not found on PATH: apt-get"):
        RedisServer(binary="redis-server-nope").start()


def test_server_that_exits_at_once_reports_exit_code(tmp_path: Path) -> None:
    script = _script(tmp_path, "echo 'bad option' >&2; exit 3")
    with pytest.raises(ServerUnavailable, match=r"exited with code 3 on start.*bad option"):
        MemcachedServer(binary=str(script), attempts=2).start()


def test_server_that_never_answers_times_out_and_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = _script(tmp_path, f"echo $$ > {pidfile}; exec sleep 30")
    server = RedisServer(binary=str(script), start_timeout=0.5)
    with pytest.raises(ServerUnavailable, match=r"did not answer on 127\.0\.0\.1:\d+ within 0\.5s"):
        server.start()
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


def test_only_loopback_is_accepted() -> None:
    assert 0 < free_port() < 65536
    with pytest.raises(ValueError, match="loopback"):
        free_port("192.0.2.1")


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-server"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
