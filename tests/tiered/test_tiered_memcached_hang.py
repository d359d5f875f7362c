"""A read of a stopped memcached under pylibmc is not remembered as an absence.

pylibmc raises on a failed write but answers a ``get`` of a server that stopped
answering (SIGSTOP: it accepts connections and answers nothing) with the default
after its poll timeout, as for a missing key. Kept in the L1 as a known absence,
that miss was served after the server was back, though the key had been written
before the outage, until a write of the key or ``L1_TIMEOUT``: a read older than
an acknowledged write. Fails on the code before: the absence was kept.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import MemcachedServer

PYLIBMC = "django.core.cache.backends.memcached.PyLibMCCache"


@pytest.fixture
def memcached_to_stop() -> Iterator[MemcachedServer]:
    server = MemcachedServer()
    server.start()
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
        server.stop()


def tiered(server: MemcachedServer, tmp_path: Path, **options: object) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": PYLIBMC, "LOCATION": server.location, "OPTIONS": {
            "binary": True, "behaviors": {"receive_timeout": 200_000, "send_timeout": 200_000,
                                          "connect_timeout": 200, "_poll_timeout": 200}}},
        "GENERATION_PATH": str(tmp_path / "generations.mmap"), "L1_TIMEOUT": 3600,
        "BREAKER_THRESHOLD": None, **options}})


def test_a_miss_read_from_a_stopped_memcached_is_not_kept_as_an_absence(
    memcached_to_stop: MemcachedServer, tmp_path: Path,
) -> None:
    writer = tiered(memcached_to_stop, tmp_path)
    writer.set("page", "written before the outage")
    # Another configuration: an L1 of its own (another process, as far as the L1 goes).
    reader = tiered(memcached_to_stop, tmp_path, L1_MAX_ENTRIES=100)

    os.kill(memcached_to_stop.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    assert reader.get("page") is None  # pylibmc's answer: the default, after its timeout
    os.kill(memcached_to_stop.pid, signal.SIGCONT)  # type: ignore[arg-type]

    assert ("page", reader.version) not in reader._l1
    assert reader.stats()["l1_misses"] == 0
