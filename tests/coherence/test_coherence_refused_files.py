"""Shared files a process would refuse now, or that were cut or overwritten.

What each case must not do:

* a generation table made group-writable (``chmod 0666``), immutable
  (``chattr +i``) or otherwise refused by processes that open it now: those
  processes write without stamping, so the processes that mapped it before
  would keep serving the values those writes replaced, until ``L1_TIMEOUT``.
  Every process looks at the file as a new one would (at its change time, the
  directories every second) and serves no L1 hit while it would be refused;
* the host file of ``COHERENCE="cluster"`` cut to nothing must not kill every
  process of the host with SIGBUS: its size is looked at again;
* garbage over the host file, a freshness far in the future, must not keep the
  host serving L1 hits while its subscriber is stopped.

Each test checks the failure it guards (the old value read; SIGBUS; fresh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.coherence.cluster.hostfile import FRESH_UNTIL, SIZE, open_host_file
from tests.tiered.helpers import SQLITE

FILE = "django.core.cache.backends.filebased.FileBasedCache"

_WRITER = """
import sys
import django
from django.conf import settings
settings.configure(SECRET_KEY="djcachebench-tests-not-secret-0123456789")
django.setup()
backend, location, options = sys.argv[1], sys.argv[2], eval(sys.argv[3])
if backend == "tiered":
    from djcachebench.backends.tiered import TieredCache
    cache = TieredCache("", {"OPTIONS": options})
else:
    from djcachebench.backends.sqlite import ShardedSQLiteCache
    cache = ShardedSQLiteCache(location, {"OPTIONS": options})
cache.set("k", "v2", 300)
"""


def _write_elsewhere(backend: str, location: str, options: dict[str, Any]) -> None:
    """``set("k", "v2")`` acknowledged by a new process."""
    done = subprocess.run([sys.executable, "-c", _WRITER, backend, location, repr(options)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def _over_files(tmp_path: Path) -> tuple[TieredCache, dict[str, Any], Path]:
    options = {"L2": {"BACKEND": FILE, "LOCATION": str(tmp_path / "l2")},
               "GENERATION_PATH": str(tmp_path / "gen.generations.mmap")}
    return TieredCache("", {"OPTIONS": options}), options, tmp_path / "gen.generations.mmap"


def _warm(cache: TieredCache) -> None:
    cache.set("k", "v1", 300)
    assert cache.get("k") == "v1" and cache.get("k") == "v1"
    assert cache.stats()["l1_hits"] >= 1


def test_a_table_others_may_write_is_not_served_from(tmp_path: Path) -> None:
    cache, options, table = _over_files(tmp_path)
    _warm(cache)
    table.chmod(0o666)  # new processes refuse it, and write unstamped
    _write_elsewhere("tiered", "", options)
    time.sleep(0.01)  # past the check interval
    assert cache.get("k") == "v2"
    table.chmod(0o600)  # acceptable again: served from again, nothing read before
    time.sleep(0.01)
    assert cache.get("k") == "v2"
    hits = cache.stats()["l1_hits"]
    assert cache.get("k") == "v2"
    assert cache.stats()["l1_hits"] == hits + 1


def test_a_table_under_a_directory_others_may_write_is_not_served_from(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    cache, options, _ = _over_files(shared)
    _warm(cache)
    shared.chmod(0o777)  # not sticky: new processes refuse the table under it
    try:
        _write_elsewhere("tiered", "", options)
        time.sleep(1.1)  # the directories are looked at every second
        assert cache.get("k") == "v2"
    finally:
        shared.chmod(0o700)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None,
                    reason="chattr +i needs root and chattr")
def test_an_immutable_table_is_not_served_from_and_kills_nobody(tmp_path: Path) -> None:
    cache, options, table = _over_files(tmp_path)
    _warm(cache)
    made = subprocess.run(["chattr", "+i", str(table)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"this file system has no immutable flag: {made.stderr!r}")
    try:
        _write_elsewhere("tiered", "", options)
        time.sleep(0.01)
        # A write to the mapping of an immutable file raises SIGBUS: the check
        # must not bump the epoch in it (this process would die here).
        assert cache.get("k") == "v2"
        assert cache.generation_table.usable is False
    finally:
        subprocess.run(["chattr", "-i", str(table)], check=False)
    time.sleep(0.01)
    assert cache.get("k") == "v2"
    assert cache.generation_table.usable is True


def test_a_sqlite_table_others_may_write_is_not_served_from(tmp_path: Path) -> None:
    location = str(tmp_path / "sq")
    cache = TieredCache("", {"OPTIONS": {"L2": {"BACKEND": SQLITE, "LOCATION": location}}})
    _warm(cache)
    Path(location, "generations.mmap").chmod(0o666)
    _write_elsewhere("sqlite", location, {})
    time.sleep(0.01)
    assert cache.get("k") == "v2"


_CUT_HOST_FILE = """
import os, sys, time
sys.path.insert(0, {root!r})
from djcachebench.coherence.cluster.hostfile import open_host_file, FRESH_UNTIL
host = open_host_file({path!r})
fresh = host.guard(stale_after=10.0)
host.fresh(time.monotonic_ns() + 5 * 10**9)
assert fresh()
os.truncate({path!r} + ".cluster", 0)
print(fresh(), os.path.getsize({path!r} + ".cluster"))
host.put(FRESH_UNTIL, time.monotonic_ns() + 5 * 10**9)  # the subscriber's next write
print(fresh(), host.host_id == open_host_file({path!r}).host_id)
"""


def test_a_host_file_cut_to_nothing_kills_nobody(tmp_path: Path) -> None:
    """In a child: the code before died of SIGBUS here."""
    root = str(Path(__file__).resolve().parents[2])
    script = _CUT_HOST_FILE.format(root=root, path=str(tmp_path / "g.mmap"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    first, second = done.stdout.splitlines()
    assert first == f"False {SIZE}"  # not fresh, and given its bytes back
    assert second == "True True"  # fresh again once the subscriber says so; same host


def test_garbage_over_the_host_file_keeps_no_host_fresh(tmp_path: Path) -> None:
    host = open_host_file(str(tmp_path / "g.mmap"))
    fresh = host.guard(stale_after=0.1)
    host.put(FRESH_UNTIL, time.monotonic_ns() + 50 * 10**6)
    assert fresh()
    host.put(FRESH_UNTIL, 0x5A5A_5A5A_5A5A_5A5A)  # random bytes, far in the future
    assert not fresh()
    host.put(FRESH_UNTIL, time.monotonic_ns() + 10 * 10**9)  # 10 s: no pong sets that
    assert not fresh()
