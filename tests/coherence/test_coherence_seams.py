"""The seams the cross-host transport uses: the table's ``guard`` and ``outlet``.

A failing guard must stop every L1 hit (reads go to the L2, counted) and a
passing one must let them resume; the outlet hears of every stamp this process
makes, and remote stamps invalidate without echoing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from djcachebench.backends.tiered import TieredCache
from djcachebench.coherence.table import CHECK_EVERY
from tests.tiered.helpers import locmem_tiered


def _warm(cache: TieredCache) -> None:
    cache.set("k", "v1")
    assert cache.get("k") == "v1"
    assert cache.stats()["l1_hits"] >= 1


def test_a_failing_guard_sends_every_read_to_the_l2(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path)
    _warm(cache)
    table = cache.generation_table
    fresh = [False]
    table.guard = lambda: fresh[0]
    time.sleep(CHECK_EVERY * 2)  # the guard is consulted by the periodic check ...
    hits = cache.stats()["l1_hits"]
    for _ in range(5):  # ... and then by every hit until it passes
        assert cache.get("k") == "v1"
        assert cache.get_many(["k"]) == {"k": "v1"}
        assert asyncio.run(cache.aget("k")) == "v1"
    stats = cache.stats()
    assert stats["l1_hits"] == hits
    assert stats["unserved"] >= 15
    fresh[0] = True
    cache.get("k")  # refills (entries read while unguarded may have been dropped)
    assert cache.get("k") == "v1"
    assert cache.stats()["l1_hits"] > hits


def test_the_outlet_hears_every_stamp_and_remote_stamps_do_not_echo(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path)
    heard: list[str | None] = []
    table = cache.generation_table
    table.outlet = heard.append
    cache.set("a", 1)
    cache.delete("b")
    cache.clear()
    finals = [cache.make_key("a"), cache.make_key("b"), None]
    assert heard == finals
    # A stamp from another host invalidates this host's L1 without telling the outlet.
    cache.set("c", 2)
    assert cache.get("c") == 2
    heard.clear()
    hits = cache.stats()["l1_hits"]
    table.stamp_remote([cache.make_key("c")])
    assert cache.get("c") == 2
    assert cache.stats()["l1_hits"] == hits  # the entry was stale: read again from the L2
    table.stamp_all_remote()
    assert heard == []
