"""Early refresh (OPTIONS["EARLY_REFRESH"], XFetch) of get_or_set, on real stores.

The draw is injected where a test must decide it (``uniform``): 0.0 never
refreshes a value that has not expired, a draw near 1 with a large beta always
does. Through the backends' own option, a huge beta refreshes on the first hit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.stampede import LEASE_PREFIX, XFETCH_PREFIX, protected_get_or_set
from tests.stampede.helpers import side_get
from tests.tiered.helpers import sqlite_tiered

NEAR_ONE = 1.0 - 1e-9  # -ln(1 - u) = 20.7



def _sqlite(tmp_path: Path, **options: Any) -> ShardedSQLiteCache:
    return ShardedSQLiteCache(str(tmp_path / "store"), {"OPTIONS": options})


@pytest.fixture(params=["sqlite", "tiered"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        return _sqlite(tmp_path)
    return sqlite_tiered(tmp_path)


class Counter:
    def __init__(self, seconds: float = 0.0) -> None:
        self.calls = 0
        self.seconds = seconds

    def __call__(self) -> str:
        self.calls += 1
        time.sleep(self.seconds)
        return f"v{self.calls}"


def _get_or_set(cache: Any, compute: Any, uniform: float, beta: float = 1.0,
                timeout: float = 60) -> Any:
    return protected_get_or_set(cache, "k", compute, timeout, None, 10.0, object(),
                                early=beta, uniform=lambda: uniform)


def test_a_hit_far_from_expiry_is_served_as_it_is(cache: Any) -> None:
    compute = Counter(0.01)
    assert _get_or_set(cache, compute, 0.0) == "v1"
    for _ in range(20):
        assert _get_or_set(cache, compute, 0.0) == "v1"
    assert compute.calls == 1
    delta, expires, _ = side_get(cache, XFETCH_PREFIX, "k")
    assert 0.01 <= delta < 5 and time.time() + 50 < expires <= time.time() + 60
    assert cache.get("k") == "v1", "the value is stored as it is, not wrapped"


def test_a_draw_past_the_expiry_refreshes_once_and_returns_the_new_value(cache: Any) -> None:
    compute = Counter(0.01)
    assert _get_or_set(cache, compute, 0.0) == "v1"
    # 0.01 s x beta 1000 x 20.7 = 207 s, past the 60 s left: this hit refreshes.
    assert _get_or_set(cache, compute, NEAR_ONE, beta=1000) == "v2"
    assert compute.calls == 2 and cache.get("k") == "v2"
    assert side_get(cache, LEASE_PREFIX, "k") is None, "the refresh drops its lease"
    assert _get_or_set(cache, compute, 0.0) == "v2" and compute.calls == 2


@pytest.mark.parametrize("timeout", [0, -1])
def test_a_hit_asked_with_a_timeout_that_stores_nothing_is_never_refreshed(
        cache: Any, timeout: int) -> None:
    """A get_or_set whose timeout is 0 or less draws no refresh: storing the new
    value with that timeout would delete the live key, and Django's get_or_set
    of a hit writes nothing."""
    compute = Counter(0.01)
    assert _get_or_set(cache, compute, 0.0) == "v1"
    assert _get_or_set(cache, compute, NEAR_ONE, beta=1000, timeout=timeout) == "v1"
    assert compute.calls == 1
    assert cache.get("k") == "v1"


def test_while_one_caller_refreshes_the_others_get_the_current_value(cache: Any) -> None:
    """The refresher holds the lease while it computes; a caller that draws a
    refresh meanwhile loses the lease and returns the value at once, unchanged."""
    assert _get_or_set(cache, lambda: "old", 0.0) == "old"
    computing, finish = threading.Event(), threading.Event()

    def slow() -> str:
        computing.set()
        assert finish.wait(30)
        return "new"

    got: list[Any] = []
    refresher = threading.Thread(
        target=lambda: got.append(_get_or_set(cache, slow, NEAR_ONE, beta=1e6)))
    refresher.start()
    try:
        assert computing.wait(30)
        others = Counter()
        for _ in range(5):
            assert _get_or_set(cache, others, NEAR_ONE, beta=1e6) == "old"
        assert others.calls == 0, "a caller that lost the lease did not compute"
    finally:
        finish.set()
        refresher.join(30)
    assert got == ["new"] and cache.get("k") == "new"


def _write_while_a_refresh_computes(cache: Any, write: Callable[[], None],
                                    computed: str) -> list[Any]:
    """``v1`` computed and noted, then a refresh drawn that computes ``computed``
    for 0.3 s, with ``write()`` made meanwhile; what the refresh returned."""
    assert _get_or_set(cache, Counter(0.01), 0.0) == "v1"
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        return computed

    got: list[Any] = []
    refresher = threading.Thread(
        target=lambda: got.append(_get_or_set(cache, slow, NEAR_ONE, beta=1e9)))
    refresher.start()
    assert started.wait(5)
    write()
    refresher.join(10)
    return got


@pytest.mark.parametrize("write", ["set", "delete"])
def test_a_write_made_while_a_refresh_computes_is_not_undone(cache: Any, write: str) -> None:
    """A value set (acknowledged) or deleted while a refresh computes is not
    replaced by the refresh's set() of a value computed from older data."""

    def write_it() -> None:
        if write == "set":
            cache.set("k", "NEW", 60)
            assert cache.get("k") == "NEW"
        else:
            cache.delete("k")
            assert cache.get("k") is None

    got = _write_while_a_refresh_computes(cache, write_it, "refreshed from old data")
    assert cache.get("k") == ("NEW" if write == "set" else None)
    assert got == ["NEW" if write == "set" else "refreshed from old data"]


@pytest.mark.parametrize("write", ["set an equal value", "touch"])
def test_a_new_expiry_given_while_a_refresh_computes_is_not_undone(
        cache: Any, write: str) -> None:
    """An equal value set with timeout=None (or a touch to None) while a refresh
    computes passes the value comparison, yet the refresh's set must not give the
    key get_or_set's timeout again."""

    def write_it() -> None:
        if write == "touch":
            assert cache.touch("k", None)
        else:
            cache.set("k", "v1", None)

    got = _write_while_a_refresh_computes(cache, write_it, "refreshed")
    assert got == ["v1"]
    store = cache._l2 if hasattr(cache, "_l2") else cache
    assert store.get_with_expiry("k") == ("v1", math.inf)


def test_a_refresh_that_raises_serves_the_value_it_had(cache: Any) -> None:
    assert _get_or_set(cache, lambda: "old", 0.0) == "old"

    def boom() -> str:
        raise RuntimeError("the view failed")

    assert _get_or_set(cache, boom, NEAR_ONE, beta=1e6) == "old"
    assert cache.get("k") == "old"
    assert side_get(cache, LEASE_PREFIX, "k") is None, "a failed refresh frees the lease"
    assert _get_or_set(cache, lambda: "new", NEAR_ONE, beta=1e6) == "new"


def test_a_value_set_by_other_code_is_never_refreshed_early(cache: Any) -> None:
    cache.set("k", "theirs", 60)  # no note of its computation: nothing to go by
    compute = Counter()
    assert _get_or_set(cache, compute, NEAR_ONE, beta=1e6) == "theirs"
    assert compute.calls == 0


def test_a_value_that_never_expires_is_never_refreshed_early(cache: Any) -> None:
    compute = Counter()
    assert _get_or_set(cache, compute, 0.0, timeout=None) == "v1"  # type: ignore[arg-type]
    assert side_get(cache, XFETCH_PREFIX, "k") is None
    assert _get_or_set(cache, compute, NEAR_ONE, beta=1e6, timeout=None) == "v1"  # type: ignore[arg-type]
    assert compute.calls == 1


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
def test_the_option_turns_it_on_and_its_default_leaves_it_off(tmp_path: Path, make: str) -> None:
    def build(name: str, **options: Any) -> Any:
        if make == "sqlite":
            return _sqlite(tmp_path / name, **options)
        return sqlite_tiered(tmp_path / name, **options)

    for name, options, expected in (("off", {}, 1), ("on", {"EARLY_REFRESH": 1e12}, 2)):
        cache = build(name, **options)
        compute = Counter(0.01)
        cache.get_or_set("k", compute, 60)
        # beta 1e12: refreshing on a hit unless the draw is within 1e-10 of 0.
        cache.get_or_set("k", compute, 60)
        assert compute.calls == expected, name


def test_early_refresh_without_a_lease_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"\['EARLY_REFRESH'\] = 1.0 needs the "
                       r"stampede lease.*\['STAMPEDE_LEASE'\] = None"):
        _sqlite(tmp_path, EARLY_REFRESH=1.0, STAMPEDE_LEASE=None)
    with pytest.raises(ImproperlyConfigured, match=r"\['EARLY_REFRESH'\] = 0 is invalid; "
                       r"allowed: a number > 0"):
        sqlite_tiered(tmp_path, EARLY_REFRESH=0)


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
@pytest.mark.parametrize(("written", "timeout"), [
    ("set by an admin, never expires", None), ("v1", None), ("v1", 3600)],
    ids=["other-value", "equal-value-never-expires", "equal-value-3600"])
def test_a_value_written_since_the_note_is_never_refreshed(
        tmp_path: Path, make: str, written: str, timeout: float | None) -> None:
    """The note of an earlier computation can outlive a plain ``set`` of a value
    that never expires; a hit must not then refresh that value (replacing it with
    the callable's, the key then expiring with the old note's timeout): a note
    names the value it was made for. A ``set`` of an *equal* value would still
    pass for the noted write and be refreshed with get_or_set's timeout: the
    stored expiry tells the two writes apart."""
    options = {"EARLY_REFRESH": 1e12}
    cache = _sqlite(tmp_path, **options) if make == "sqlite" else sqlite_tiered(
        tmp_path, **options)
    compute = Counter(0.01)
    assert cache.get_or_set("k", compute, 60) == "v1"
    cache.set("k", written, timeout)
    for _ in range(3):
        assert cache.get_or_set("k", compute, 60) == written
    assert compute.calls == 1
    assert cache.get("k") == written
    store = cache if make == "sqlite" else cache._l2
    _, expires = store.get_with_expiry("k")
    assert expires == math.inf if timeout is None else expires > time.time() + 3000


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
def test_aget_or_set_refreshes_early_as_get_or_set_does(tmp_path: Path, make: str) -> None:
    """TieredCache's aget_or_set refreshes early as get_or_set does, rather than
    returning any hit from its L1."""
    import asyncio

    options = {"EARLY_REFRESH": 1e12}
    cache = _sqlite(tmp_path, **options) if make == "sqlite" else sqlite_tiered(
        tmp_path, **options)
    compute = Counter(0.01)

    async def run() -> list[Any]:
        return [await cache.aget_or_set("k", compute, 60) for _ in range(3)]

    assert asyncio.run(run()) == ["v1", "v2", "v3"]
