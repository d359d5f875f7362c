"""TieredCache and timeouts: a timeout its L2 would refuse is refused before anything is
written, and an L1 copy never outlives the L2's expiry (writers racing their stamps,
redis keeping whole seconds, a TTL set past the adapter).

Each test pins one of these rules.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends.tiered import TieredCache
from tests.tiered.helpers import locmem_tiered


class PausingLocMem(LocMemCache):
    """A LocMemCache whose ``set`` of one key stops after writing, before the
    adapter's stamp: a writer descheduled between its L2 write and its stamp."""

    pause_key: ClassVar[str | None] = None
    written = threading.Event()
    release = threading.Event()
    tiered_returns_what_was_set = True

    def tiered_failure_count(self) -> int:
        return 0

    def set(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> None:
        super().set(key, value, timeout, version)
        if key == PausingLocMem.pause_key:
            PausingLocMem.written.set()
            PausingLocMem.release.wait(10)


def _pausing(tmp_path: Path, **options: Any) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "tests.tiered.test_tiered_timeouts.PausingLocMem",
               "LOCATION": str(tmp_path / "l2")},
        "GENERATION_PATH": str(tmp_path / "gen.mmap"), **options}})


def test_racing_writers_never_leave_an_l1_copy_past_the_l2_expiry(tmp_path: Path) -> None:
    """Defect 3: B sets with no timeout and is descheduled before its stamp; C sets
    with timeout=1 and stamps; B's stamp lands last. Readers took the expiry
    from the slot (B's: never) and served C's value after the L2 dropped it."""
    b = _pausing(tmp_path, L1_MAX_ENTRIES=10)
    c = _pausing(tmp_path, L1_MAX_ENTRIES=11)
    reader = _pausing(tmp_path, L1_MAX_ENTRIES=12)
    PausingLocMem.pause_key = "k"
    PausingLocMem.written.clear()
    PausingLocMem.release.clear()
    slow = threading.Thread(target=b.set, args=("k", "from b", None))
    slow.start()
    try:
        assert PausingLocMem.written.wait(10)
        PausingLocMem.pause_key = None
        c.set("k", "from c", 1)
    finally:
        PausingLocMem.release.set()
        slow.join(10)
    assert reader.get("k") == "from c"
    assert reader.get("k") == "from c"
    time.sleep(1.3)
    assert reader.get("k") is None, "an L1 copy outlived the L2 entry"
    assert c.get("k") is None and b.get("k") is None


def test_nan_timeout_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Defect 10: timeout=nan was written and never expired."""
    cache = locmem_tiered(tmp_path)
    for op in (lambda: cache.set("k", "v", float("nan")),
               lambda: cache.add("k", "v", float("nan")),
               lambda: cache.set_many({"k": "v"}, float("nan"))):
        with pytest.raises(ValueError, match="timeout"):
            op()
        assert cache.l2.get("k") is None


def test_a_decimal_nan_timeout_raises_what_the_l2_raises(tmp_path: Path) -> None:
    """TieredCache refused it with ValueError, where its L2 (Django's BaseCache
    arithmetic: float + Decimal) raises TypeError; nothing is written either way."""
    from decimal import Decimal

    from django.core.cache.backends.locmem import LocMemCache

    cache = locmem_tiered(tmp_path)
    for timeout in (Decimal("NaN"), Decimal("1")):
        with pytest.raises(TypeError):
            LocMemCache("decimal", {}).set("k", "v", timeout)
        with pytest.raises(TypeError):
            cache.set("k", "v", timeout)
    assert cache.get("k") is None


@pytest.mark.servers
def test_fractional_timeouts_over_whole_second_redis(tmp_path: Path, redis_server: Any) -> None:
    """Defect 9: Django's RedisCache keeps int(timeout) seconds; the writer's L1
    kept the full fractional timeout (with 0.4 s, a value redis never kept)."""
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": redis_server.location, "KEY_PREFIX": f"frac{os.getpid()}"},
        "GENERATION_PATH": str(tmp_path / "gen.mmap")}})
    cache.set("short", "v", 0.4)
    assert cache.l2.get("short") is None  # redis never kept it
    assert cache.get("short") is None
    cache.set("k", "v", 1.9)
    assert cache.get("k") == "v"
    deadline = time.time() + 3
    while cache.l2.get("k") is not None and time.time() < deadline:
        time.sleep(0.02)
    assert cache.l2.get("k") is None
    assert cache.get("k") is None, "the L1 served a value redis had dropped"


@pytest.mark.servers
def test_reads_over_redis_keep_the_server_ttl(tmp_path: Path, redis_server: Any) -> None:
    """A value read from redis is kept in L1 no longer than redis keeps it."""
    opts = {"L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                   "LOCATION": redis_server.location, "KEY_PREFIX": f"ttl{os.getpid()}"},
            "GENERATION_PATH": str(tmp_path / "gen.mmap")}
    reader = TieredCache("", {"OPTIONS": {**opts, "L1_MAX_ENTRIES": 77}})
    reader.l2.set("k", "v", 1)  # written past the adapter, with a TTL
    assert reader.get("k") == "v" and reader.get("k") == "v"
    assert reader.stats()["l1_hits"] == 1
    time.sleep(1.2)
    assert reader.get("k") is None
