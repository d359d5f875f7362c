"""A wall clock set back never lets a failed write leave an older value readable.

A failed write voids the key's rows stored until it failed (``store/counts.py``,
"Why floors"). After the clock is set back (an NTP step, an operator's
``date -s``, a VM restored from a snapshot), rows stored before the step carry
times later than the clock, so a floor taken from the clock alone would stay
below them and the value the failed write meant to replace or remove would be
served again. So a floor is at least the ``stored`` time of the rows it voids,
and a write that succeeds stores its row just past its key's floor when the
clock is behind it, so it is read at once instead of reading as absent until
the clock catches up.

Each test fails without these floors (the old value is read, or the new one is
absent). The step is simulated in this process by shifting ``time.time`` and
``time.time_ns``; the lock holder is another process, as in
``test_sqlite_failed_writes.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from tests.tiered.helpers import SQLITE

from .helpers import keys_elsewhere, shard_locked, shard_of, shard_path
from .test_sqlite_failed_writes import FAILING_WRITES, FAST, assert_absent

STEP_S = 3600  # an hour back: far beyond any write's duration


@contextlib.contextmanager
def clock_set_back(monkeypatch: pytest.MonkeyPatch, seconds: int = STEP_S) -> Iterator[None]:
    """The wall clock of this process, ``seconds`` behind from now on."""
    real_time, real_time_ns = time.time, time.time_ns
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: real_time() - seconds)
        patch.setattr(time, "time_ns", lambda: real_time_ns() - seconds * 1_000_000_000)
        yield


@pytest.mark.slow
@pytest.mark.parametrize("write", list(FAILING_WRITES))
def test_a_write_that_fails_after_the_clock_went_back_leaves_no_older_value(
    make_cache: Callable[..., ShardedSQLiteCache], monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    cache = make_cache(FAST)
    cache.set("k", "old", timeout=None)
    others = keys_elsewhere(cache, shard_of(cache, "k"), 4)
    cache.set_many({o: "kept" for o in others}, timeout=None)
    with clock_set_back(monkeypatch):
        with shard_locked(shard_path(cache, "k"), "write"):
            FAILING_WRITES[write](cache)
        assert cache.stats()["voided"] == 1
        assert_absent(cache, "k")
        assert cache.get_many(others) == {o: "kept" for o in others}
        # A write that succeeds is read at once, though its clock is an hour
        # behind the floor it just raised.
        # (No expiry: one taken from the clock set back ends an hour early.)
        cache.set("k", "after", timeout=None)
        assert cache.get("k") == "after"
        assert cache.get_many(["k"]) == {"k": "after"}
        assert cache.add("k", "added") is False
        assert cache.touch("k", None) is True
    assert cache.get("k") == "after"  # and once the clock is back


@pytest.mark.slow
def test_every_write_after_the_step_is_live(
    make_cache: Callable[..., ShardedSQLiteCache], monkeypatch: pytest.MonkeyPatch
) -> None:
    """set_many, add, incr and a value in a file, each after a failure voided their
    keys with the clock behind: each is read back, and a later failure voids it."""
    cache = make_cache({**FAST, "MAX_ENTRIES": None})
    big = b"x" * 2_000_000  # kept in a value file
    start = {"many1": "old", "many2": "old", "added": "old", "n": 1, "big": b"old"}
    cache.set_many(start, timeout=None)
    with clock_set_back(monkeypatch):
        for key in start:
            with shard_locked(shard_path(cache, key), "write"):
                cache.set(key, "lost")
            assert cache.get(key) is None, key
        assert cache.set_many({"many1": "new", "many2": "new"}) == []
        assert cache.add("added", "new") is True
        assert cache.add("n", 5) is True
        assert cache.incr("n") == 6
        cache.set("big", big)
        assert cache.get_many(list(start)) == {
            "many1": "new", "many2": "new", "added": "new", "n": 6, "big": big}
        with shard_locked(shard_path(cache, "big"), "write"):
            cache.delete("big")
        assert cache.get("big") is None


@pytest.mark.slow
def test_a_failed_clear_after_the_step_voids_what_was_stored_before_it(
    make_cache: Callable[..., ShardedSQLiteCache], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make_cache(FAST)
    index = shard_of(cache, "k")
    others = keys_elsewhere(cache, index, 8)
    cache.set_many({"k": "old", **{o: "v" for o in others}}, timeout=None)
    with clock_set_back(monkeypatch):
        with shard_locked(shard_path(cache, "k"), "write"):
            cache.clear()
        assert cache.get_many(["k", *others]) == {}
        cache.set("k", "new")
        assert cache.get("k") == "new"


@pytest.mark.slow
def test_tiered_over_it_serves_no_older_value_after_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "sqlite"), "OPTIONS": FAST}}})
    cache.set("k", "old", timeout=None)
    assert cache.get("k") == "old"
    with clock_set_back(monkeypatch):
        with shard_locked(shard_path(cache._l2, "k"), "write"):
            cache.set("k", "new")
        assert cache.get("k") is None
        cache.set("k", "newer")
        assert cache.get("k") == "newer"
