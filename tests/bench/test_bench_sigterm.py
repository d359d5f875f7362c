"""A harness command stopped with SIGTERM (a CI timeout, ``kill``, a terminal
closed) stops every server it started: nothing of its session outlives it.

The command runs in a session of its own, so every process it started (the
memcached and redis-server of the pool, gunicorn and its workers, wrk, the
bench workers) carries that session's id; after the command exits, no process
with that id may remain.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _session_members(sid: int) -> dict[int, str]:
    members = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3]: session id
            members[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return members


def _until(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def _terminate_mid_run(args: list[str], running: str, tmp_path: Path) -> dict[int, str]:
    """Start ``djcachebench ARGS``; once a process whose command line contains
    ``running`` is up, SIGTERM the command alone; what of its session is left."""
    proc = subprocess.Popen([sys.executable, "-m", "djcachebench", *args,
                             "--out", str(tmp_path / "out")],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert _until(lambda: any(running in c for c in _session_members(proc.pid).values()),
                      120), f"{running} never started"
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(60)
        _until(lambda: not _session_members(proc.pid), 10)
        return _session_members(proc.pid)
    finally:
        for pid in _session_members(proc.pid):  # leave nothing behind, whatever happened
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(shutil.which("wrk") is None or shutil.which("memcached") is None,
                    reason="wrk or memcached not installed")
def test_sigterm_of_http_stops_gunicorn_wrk_and_the_servers(tmp_path: Path) -> None:
    left = _terminate_mid_run(["http", "--backends", "memcached", "--routes", "light",
                               "--duration", "30", "--no-plot"], "wrk", tmp_path)
    assert left == {}, left


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_sigterm_of_bench_stops_its_workers_and_the_servers(tmp_path: Path) -> None:
    left = _terminate_mid_run(["bench", "--backends", "redis", "--procs", "2",
                               "--ops", "5000000", "--no-plot"], "spawn_main", tmp_path)
    assert left == {}, left
