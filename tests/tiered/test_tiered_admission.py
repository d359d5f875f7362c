"""The L1 stops taking new entries while it does not pay (tiered/admission.py).

Spread reads (far more keys than the L1 holds) must end up bypassing: misses
keep nothing and writes keep nothing, while every answer stays right. Hot reads
must never bypass, and a spread phase followed by a hot one must reopen the L1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.tiered.admission import BYPASS_BELOW, SAMPLE, WINDOW, Doorkeeper, Gate
from tests.tiered.helpers import locmem_tiered, sqlite_tiered


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


# -- the doorkeeper: a full L1 takes a key on its second miss ---------------------


def test_doorkeeper_admits_a_key_on_its_second_miss() -> None:
    door = Doorkeeper(10)
    key = ("k", 1)
    assert not door.admit(key)
    assert door.admit(key)
    assert door.kept_out == 1
    door.seen(("s", 1))  # an entry of the L1 read again after it went stale
    assert door.admit(("s", 1))


def test_doorkeeper_forgets_after_an_l1_turnover() -> None:
    door = Doorkeeper(1000)
    assert not door.admit(("k", 1))
    i = 0
    while True:  # other keys until twice the L1's entries were added: cleared
        added = door._added
        door.admit(("other", i))
        i += 1
        if door._added < added:
            break
    assert 2000 <= i < 2200  # a few others were false positives, never added
    assert not door.admit(("k", 1))


def test_two_hot_keys_never_lock_each_other_out() -> None:
    """Keys that share a cell must both get in: a filter only sets cells."""
    door = Doorkeeper(10)
    mask = len(door._cells) - 1
    first = ("a", 1)
    cell, other = hash(first) & mask, (hash(first) >> 24) & mask
    # Shares the first cell only: a rival whose second cell is one of first's
    # would be a false positive of the filter (admitted at once), not a rival.
    rival = next(("b", i) for i in range(1_000_000) if hash(("b", i)) & mask == cell
                 and (hash(("b", i)) >> 24) & mask not in (cell, other))
    for key in (first, rival):
        assert not door.admit(key)
    assert door.admit(first) and door.admit(rival)


def _fill_l1(cache: TieredCache, keys: range) -> None:
    for i in keys:
        cache.set(f"k{i}", i)  # write-through: each is kept
    assert not cache._l1.has_room()


def test_a_full_l1_keeps_a_key_on_its_second_miss_only(cache: TieredCache) -> None:
    _fill_l1(cache, range(10))
    cache._l2.set("cold", "value")  # in the L2, never read
    kept_out = cache.stats()["l1_kept_out"]
    assert cache.get("cold") == "value"
    assert ("cold", 1) not in cache._l1.records  # a first miss: the tail stays out
    assert cache.stats()["l1_kept_out"] == kept_out + 1
    assert cache.get("cold") == "value"
    assert ("cold", 1) in cache._l1.records  # read again: it is kept
    hits = cache.stats()["l1_hits"]
    assert cache.get("cold") == "value"
    assert cache.stats()["l1_hits"] == hits + 1


def test_an_l1_with_room_keeps_every_miss(cache: TieredCache) -> None:
    cache._l2.set("cold", "value")
    assert cache._l1.has_room()
    assert cache.get("cold") == "value"
    assert ("cold", 1) in cache._l1.records
    assert cache.stats()["l1_kept_out"] == 0


def test_an_invalidated_entry_is_refilled_on_its_next_miss(tmp_path: Path) -> None:
    cache = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=10)
    _fill_l1(cache, range(10))
    cache._l2.set("k3", "new")  # another writer: the L2 stamps, the L1 entry goes stale
    assert cache.get("k3") == "new"
    assert ("k3", 1) in cache._l1.records  # refilled at once: it is read again
    assert cache.stats()["l1_kept_out"] == 0


def test_a_full_l1_keeps_a_written_key_it_holds_or_has_seen(cache: TieredCache) -> None:
    _fill_l1(cache, range(10))
    cache.set("k3", "again")  # held: write-through as ever
    assert cache._l1.records[("k3", 1)][2] == "again"
    cache.set("cold", "one")  # a tail key's first write: a plain L2 write, nothing kept
    assert ("cold", 1) not in cache._l1.records
    assert cache.get("cold") == "one"  # the read after it is its second touch: kept
    assert ("cold", 1) in cache._l1.records
    cache.delete("other")  # not held, first touch: no absence kept either
    assert ("other", 1) not in cache._l1.records
    assert cache.get("other") is None


def test_a_bypassing_gate_keeps_a_sampled_miss_on_its_second_sampling_only(
        cache: TieredCache) -> None:
    """In a spread phase a key read once is rarely read again: even an L1 with
    room takes a sampled miss only when the key was sampled before."""
    cache._l2.set("cold", "value")
    gate = cache._gate
    gate.bypassing = True
    assert cache._l1.has_room()
    for expect_kept in (False, True):
        gate._sample = SAMPLE - 1  # the next miss is the sampled one
        assert cache.get("cold") == "value"
        assert (("cold", 1) in cache._l1.records) is expect_kept
    assert cache.stats()["l1_kept_out"] == 1

