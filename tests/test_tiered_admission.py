"""The L1 stops taking new entries while it does not pay (tiered/admission.py).

Spread reads (far more keys than the L1 holds) must end up bypassing: misses
keep nothing and writes keep nothing, while every answer stays right. Hot reads
must never bypass, and a spread phase followed by a hot one must reopen the L1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.tiered.admission import BYPASS_BELOW, SAMPLE, WINDOW, Gate
from tests.tiered_helpers import locmem_tiered, sqlite_tiered


def test_the_gate_closes_below_the_threshold_and_samples() -> None:
    gate = Gate()
    answered = 0
    for _ in range(WINDOW - 1):  # a window in which the L1 answered nothing
        assert gate.admit(answered)
    gate.admit(answered)  # the window's last read decides
    assert gate.bypassing
    gate.bypassed = 0
    gate._sample = 0
    admitted = sum(gate.admit(answered) for _ in range(SAMPLE * 10))
    assert admitted == 10 and gate.bypassed == SAMPLE * 10 - 10
    # A window in which the L1 answered well over the threshold reopens it.
    answered += int(WINDOW * 4 * BYPASS_BELOW)
    for _ in range(WINDOW):
        gate.admit(answered)
    assert not gate.bypassing


@pytest.fixture(params=["locmem", "sqlite"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> TieredCache:
    if request.param == "locmem":
        return locmem_tiered(tmp_path, L1_MAX_ENTRIES=10)
    return sqlite_tiered(tmp_path, L1_MAX_ENTRIES=10)


def _spread(cache: TieredCache, keys: int, rounds: int) -> None:
    for round_ in range(rounds):
        for i in range(keys):
            assert cache.get(f"k{i}") == i, (round_, i)


def test_spread_reads_bypass_and_stay_right(cache: TieredCache) -> None:
    keys = 200  # twenty times the L1 (and under the L2's 300 entries)
    for i in range(keys):
        cache.set(f"k{i}", i)
    _spread(cache, keys, 3 * WINDOW // keys + 2)
    stats = cache.stats()
    assert stats["l1_bypass_windows"] >= 1 and stats["l1_bypassed"] > 0
    # While bypassing, a write keeps nothing in the L1 but is still right everywhere.
    cache.set("k1", "new")
    assert ("k1", 1) not in cache._l1.records
    assert cache.get("k1") == "new"
    cache.delete("k2")
    assert cache.get("k2") is None


def test_hot_reads_never_bypass_and_a_hot_phase_reopens(cache: TieredCache) -> None:
    for i in range(200):
        cache.set(f"k{i}", i)
    for _ in range(4 * WINDOW):
        for i in range(5):
            assert cache.get(f"k{i}") == i
    assert cache.stats()["l1_bypass_windows"] == 0
    _spread(cache, 200, 3 * WINDOW // 200 + 2)
    assert cache._gate.bypassing
    hits = cache.stats()["l1_hits"]
    for _ in range(2 * WINDOW * SAMPLE // 5):  # sampled fills bring the hot keys back
        for i in range(5):
            assert cache.get(f"k{i}") == i
    assert cache.get("k150") == 150  # the next miss decides: the L1 pays again
    assert not cache._gate.bypassing
    assert cache.stats()["l1_hits"] - hits > WINDOW
