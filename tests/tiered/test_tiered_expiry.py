"""An L1 entry never outlives the expiry of the value it copies.

The deadline of an entry is taken before its value is pickled (else a large
dict outlives its L2 expiry by the pickling time); with ``COHERENCE="none"`` a
value whose expiry the read does not tell is not kept for the whole
``L1_TIMEOUT``; a wall-clock step does not make entries outlive the L2's
wall-clock expiry.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends import tiered as tiered_module
from djcachebench.backends.tiered import TieredCache
from tests.tiered.helpers import locmem_tiered, sqlite_tiered


class UnknownBackend(LocMemCache):
    """A backend TieredCache knows nothing of: no expiry on read, no failure probe."""


def test_the_deadline_is_taken_before_the_value_is_pickled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = sqlite_tiered(tmp_path)
    reader = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=100)  # another L1: a read fill
    started = time.time()
    writer.set("k", {"a": [1, 2]}, timeout=1)

    def slow_dumps(value: Any, *args: Any) -> bytes:
        time.sleep(0.5)  # what pickling a dict of some 10^6 entries takes
        return pickle.dumps(value, *args)

    # Only the L1's own copy is slow (the store's serializer is not this one).
    monkeypatch.setattr(tiered_module, "pickle",
                        SimpleNamespace(dumps=slow_dumps, HIGHEST_PROTOCOL=5))
    assert reader.get("k") == {"a": [1, 2]}  # kept, pickled, in its L1
    # From the moment the store says expired (polled: a loaded machine may
    # delay it), the L1 copy must be over too; before the fix it lived on for
    # the 0.5 s the pickling took.
    time.sleep(max(0.0, started + 0.95 - time.time()))
    while reader._l2.get("k") is not None and time.time() < started + 5:
        time.sleep(0.005)
    assert reader.get("k") is None


def test_a_value_whose_expiry_the_read_does_not_tell_is_not_kept(tmp_path: Path) -> None:
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": f"{__name__}.UnknownBackend", "LOCATION": str(tmp_path)},
        "COHERENCE": "none", "L1_TIMEOUT": 60}})
    cache.set("k", "v", timeout=1)
    assert cache.get("k") == "v"
    assert cache.get("k") == "v"
    time.sleep(1.2)
    assert cache.get("k") is None
    assert cache.stats()["no_expiry"] >= 1


@pytest.mark.parametrize("make", ["sqlite", "locmem"])
def test_a_forward_wall_clock_step_ends_the_entries_it_expired(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: str) -> None:
    cache = sqlite_tiered(tmp_path) if make == "sqlite" else locmem_tiered(tmp_path)
    reader = (sqlite_tiered(tmp_path, L1_MAX_ENTRIES=100) if make == "sqlite"
              else locmem_tiered(tmp_path, L1_MAX_ENTRIES=100))
    cache.set("k", "v", timeout=5)
    assert cache.get("k") == "v"
    assert reader.get("k") == "v"
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 100)
    time.sleep(0.01)  # past the table's check interval
    assert cache._l2.get("k") is None  # the L2 says expired
    assert cache.get("k") is None
    assert reader.get("k") is None
    assert cache.has_key("k") is False
    assert cache.stats()["coherence_clock_steps"] + reader.stats()["coherence_clock_steps"] >= 1
