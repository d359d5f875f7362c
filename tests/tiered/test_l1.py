"""The L1 map on its own (no Django): LRU order, both bounds, deadlines, stats."""

from __future__ import annotations

import threading

import pytest

from djcachebench.l1 import L1Map


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


FOREVER = float("inf")


def test_get_put_pop(clock: FakeClock) -> None:
    m = L1Map(10, clock=clock)
    assert m.get("a") is None
    assert m.put("a", ("A", 1), 1, FOREVER)
    assert m.get("a") == ("A", 1)
    assert "a" in m and len(m) == 1
    assert m.pop("a") is True
    assert m.pop("a") is False
    assert m.get("a") is None and m.nbytes == 0


def test_entry_bound_evicts_least_recently_used(clock: FakeClock) -> None:
    m = L1Map(3, clock=clock)
    for k in "abc":
        m.put(k, (k,), 1, FOREVER)
    m.get("a")  # a is now the most recent: b is the oldest
    m.put("d", ("d",), 1, FOREVER)
    assert m.keys() == ["c", "a", "d"]
    assert m.get("b") is None
    assert m.stats.evictions == 1


def test_byte_bound_evicts_until_it_fits(clock: FakeClock) -> None:
    m = L1Map(100, max_bytes=100, clock=clock)
    m.put("a", ("a",), 40, FOREVER)
    m.put("b", ("b",), 40, FOREVER)
    m.put("c", ("c",), 40, FOREVER)  # 120 > 100: a goes
    assert m.keys() == ["b", "c"] and m.nbytes == 80
    m.put("d", ("d",), 90, FOREVER)  # needs b and c gone
    assert m.keys() == ["d"] and m.nbytes == 90
    assert m.stats.evictions == 3


def test_replacing_an_entry_recounts_its_bytes(clock: FakeClock) -> None:
    m = L1Map(100, max_bytes=100, clock=clock)
    m.put("a", ("a",), 60, FOREVER)
    m.put("a", ("A",), 30, FOREVER)
    assert m.nbytes == 30 and m.get("a") == ("A",)
    m.put("b", ("b",), 70, FOREVER)
    assert m.keys() == ["a", "b"] and m.stats.evictions == 0


def test_item_bigger_than_the_byte_bound_is_not_kept(clock: FakeClock) -> None:
    m = L1Map(100, max_bytes=50, clock=clock)
    m.put("a", ("old",), 10, FOREVER)
    m.put("x", ("x",), 10, FOREVER)
    assert m.put("a", ("huge",), 51, FOREVER) is False
    assert m.get("a") is None, "an older value must not survive a rejected newer one"
    assert m.get("x") == ("x",), "a rejected item must not flush the others"
    assert m.stats.rejected == 1


def test_deadline(clock: FakeClock) -> None:
    m = L1Map(10, clock=clock)
    m.put("a", ("a",), 1, clock.now + 5)
    clock.now += 4.9
    assert m.get("a") == ("a",)
    clock.now += 0.1  # deadline reached: expired (deadline is exclusive)
    assert m.get("a") is None
    assert len(m) == 0 and m.nbytes == 0 and m.stats.expirations == 1


def test_past_deadline_is_not_stored(clock: FakeClock) -> None:
    m = L1Map(10, clock=clock)
    m.put("a", ("old",), 1, FOREVER)
    assert m.put("a", ("new",), 1, clock.now) is False
    assert m.get("a") is None


def test_purge_expired(clock: FakeClock) -> None:
    m = L1Map(10, clock=clock)
    m.put("a", ("a",), 3, clock.now + 1)
    m.put("b", ("b",), 4, clock.now + 10)
    clock.now += 2
    assert "a" not in m and "b" in m
    assert m.purge_expired() == 1
    assert m.keys() == ["b"] and m.nbytes == 4


def test_zero_entries_stores_nothing(clock: FakeClock) -> None:
    m = L1Map(0, clock=clock)
    assert m.put("a", ("a",), 1, FOREVER) is False
    assert len(m) == 0


def test_clear(clock: FakeClock) -> None:
    m = L1Map(10, max_bytes=10, clock=clock)
    m.put("a", ("a",), 5, FOREVER)
    m.clear()
    assert len(m) == 0 and m.nbytes == 0
    assert m.put("b", ("b",), 10, FOREVER)


def test_rejects_negative_bounds() -> None:
    with pytest.raises(ValueError):
        L1Map(-1)
    with pytest.raises(ValueError):
        L1Map(1, max_bytes=-1)


def test_threads_keep_the_bounds() -> None:
    m = L1Map(50, max_bytes=400)

    def work(seed: int) -> None:
        for i in range(5000):
            k = (seed * 7 + i) % 120
            if i % 3:
                m.put(k, (k,), 1 + k % 13, FOREVER)
            else:
                m.get(k)
            if i % 50 == 0:
                m.pop(k)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(m) <= 50
    assert m.nbytes <= 400
    assert m.nbytes == sum(1 + k % 13 for k in m)
