"""A busy or broken shard costs a bounded wait and a miss, never a hang or a crash.

Pinned (docs/architecture.md "Waiting for a busy shard" and "Faults",
store/core.py "Fault policy"):

- A shard locked by another process makes ``get``/``set`` wait about
  ``LOCK_TIMEOUT`` per attempt for ``1 + RETRIES`` attempts, then give up
  within ``RetryPolicy.worst_case()``: reads return the default, writes
  report failure, ``stats()`` counts ``lock_waits`` and ``give_ups``. With
  ``RAISE_ON_TIMEOUT`` the give-up raises ``ShardLockTimeout``. Other shards
  keep serving meanwhile, and the shard works again once the lock is gone.
- A shard file that is garbage or truncated is moved aside (``*.corrupt-*``,
  nothing deleted), replaced by a new empty shard, counted in
  ``stats()["corruptions"]``; its keys read as misses, the other shards keep
  their keys.

What blocks whom (SQLite WAL): a writer's open transaction blocks other
writers but *not* readers, who keep reading the last commit. To block a
reader, the holder uses ``PRAGMA locking_mode=EXCLUSIVE`` and commits a write:
its connection then keeps an exclusive lock on the file, and a new
connection cannot even read the schema. It can only take that lock while no
other connection has the file open (an open WAL connection holds a shared
lock on it), so those tests first close the cache's connections, as a freshly
started worker process would be.

Timing bounds are deliberately loose (the machine is shared): "waited at
least" uses the sleeps' lower bound, "gave up within" adds a wide margin.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.retry import CacheUnavailable, RetryPolicy, ShardLockTimeout

from .helpers import (
    SPAWN,
    join_all,
    keys_elsewhere,
    keys_in_shard,
    shard_locked,
    shard_of,
    shard_path,
    start,
)
from .workers import hold_shard_lock

POLICY = {"LOCK_TIMEOUT": 0.3, "RETRIES": 1, "RETRY_BACKOFF": 0.05}
MARGIN = 5.0  # seconds of slack on top of worst_case() for a loaded machine


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``(result, elapsed seconds)`` of ``call()``."""
    t0 = time.monotonic()
    result = call()
    return result, time.monotonic() - t0


def assert_gave_up_in_bounds(cache: ShardedSQLiteCache, elapsed: float) -> None:
    """Waited every attempt's LOCK_TIMEOUT, and not much longer than the policy allows."""
    policy = cache._store.policy
    least = (policy.retries + 1) * policy.lock_timeout
    assert elapsed >= 0.9 * least, f"gave up after {elapsed:.3f}s, before {least}s of waiting"
    assert elapsed < policy.worst_case() + MARGIN, f"waited {elapsed:.3f}s"


@pytest.fixture
def locked_setup(make_cache: Callable[..., ShardedSQLiteCache]) -> Callable[..., Any]:
    """A cache with POLICY, key ``k`` stored, and the path of its shard."""

    def setup(**extra: Any) -> tuple[ShardedSQLiteCache, str]:
        cache = make_cache({**POLICY, **extra})
        cache.set("k", "old")
        return cache, shard_path(cache, "k")

    return setup


# -- readers ------------------------------------------------------------------------


@pytest.mark.slow
def test_get_on_an_exclusively_locked_shard_gives_up_within_the_policy(
    locked_setup: Callable[..., Any]
) -> None:
    cache, path = locked_setup()
    cache.close_connections()
    with shard_locked(path, "exclusive"):
        value, elapsed = timed(lambda: cache.get("k", "default"))
        assert value == "default"
        assert_gave_up_in_bounds(cache, elapsed)
        stats = cache.stats()
        assert stats["give_ups"] == 1 and stats["lock_waits"] == 1
        assert stats["misses"] == 1 and stats["hits"] == 0
    assert cache.get("k") == "old"  # the shard serves again once released


@pytest.mark.slow
def test_reader_is_not_blocked_by_another_process_write_transaction(
    locked_setup: Callable[..., Any]
) -> None:
    """WAL: a reader sees the last commit while another process holds the write lock."""
    cache, path = locked_setup()
    with shard_locked(path, "write"):
        assert cache.get("k") == "old"
        assert cache.has_key("k")
        assert cache.get_many(["k"]) == {"k": "old"}
    assert cache.stats()["lock_waits"] == 0


# -- writers ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["write", "exclusive"])
def test_set_on_a_locked_shard_gives_up_within_the_policy(
    locked_setup: Callable[..., Any], how: str
) -> None:
    cache, path = locked_setup()
    if how == "exclusive":
        cache.close_connections()
    with shard_locked(path, how):
        result, elapsed = timed(lambda: cache.set("k", "new"))
        assert result is None
        assert_gave_up_in_bounds(cache, elapsed)
        stats = cache.stats()
        assert stats["give_ups"] == 1 and stats["lock_waits"] == 1
        assert stats["sets"] == 1  # only the set before the lock
        # The value the failed set meant to replace is not served after it
        # (test_sqlite_failed_writes.py), even while reads still work.
        assert cache.get("k") is None
    assert cache.get("k") is None
    cache.set("k", "new")  # the next write that succeeds is served
    assert cache.get("k") == "new"


@pytest.mark.slow
def test_every_write_reports_failure_on_a_locked_shard(locked_setup: Callable[..., Any]) -> None:
    """``add``/``delete``/``touch`` -> False, ``set_many`` -> the keys not stored,
    ``incr`` (which has no failure value) -> ``CacheUnavailable``."""
    cache, path = locked_setup()
    fresh, batch, counter = keys_in_shard(cache, shard_of(cache, "k"), 3, prefix="same")
    cache.set(counter, 1)
    with shard_locked(path, "write"):
        assert cache.add(fresh, "v") is False
        assert cache.touch("k", 100) is False  # first: after the failed delete "k" is absent
        assert cache.delete("k") is False
        assert cache.set_many({batch: "v"}) == [batch]
        with pytest.raises(CacheUnavailable):
            cache.incr(counter)
        assert cache.stats()["give_ups"] == 5
    assert cache.get("k") is None  # the failed delete leaves no value to read
    assert cache.get_many([fresh, batch]) == {}
    assert cache.get(counter) == 1  # a failed incr raised: its caller knows


@pytest.mark.slow
def test_raise_on_timeout_raises_shard_lock_timeout(locked_setup: Callable[..., Any]) -> None:
    cache, path = locked_setup(RAISE_ON_TIMEOUT=True)
    cache.close_connections()
    with shard_locked(path, "exclusive"):
        t0 = time.monotonic()
        with pytest.raises(ShardLockTimeout) as info:
            cache.get("k")
        assert_gave_up_in_bounds(cache, time.monotonic() - t0)
        assert info.value.path == path
        assert info.value.waited >= 0.9 * 2 * POLICY["LOCK_TIMEOUT"]
        t0 = time.monotonic()
        with pytest.raises(ShardLockTimeout):
            cache.set("k", "new")
        assert_gave_up_in_bounds(cache, time.monotonic() - t0)
        with pytest.raises(ShardLockTimeout):
            cache.add("k", "new")
        with pytest.raises(ShardLockTimeout):
            cache.delete("k")
        assert cache.stats()["give_ups"] == 4
    assert cache.get("k") is None  # voided by the failed write (test_sqlite_failed_writes.py)


@pytest.mark.slow
def test_zero_lock_timeout_and_retries_give_up_at_once(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"LOCK_TIMEOUT": 0, "RETRIES": 0, "RETRY_BACKOFF": 0})
    cache.set("k", "old")
    with shard_locked(shard_path(cache, "k"), "write"):
        _, elapsed = timed(lambda: cache.set("k", "new"))
        assert elapsed < MARGIN
        assert cache.stats()["give_ups"] == 1
    assert cache.get("k") is None  # voided by the failed write (test_sqlite_failed_writes.py)


@pytest.mark.slow
def test_waiting_ends_when_the_lock_is_released(locked_setup: Callable[..., Any]) -> None:
    """A wait that ends in time is counted in lock_waits, is not a give-up, and the
    write lands."""
    cache, path = locked_setup(LOCK_TIMEOUT=30.0)
    ready, release = SPAWN.Event(), SPAWN.Event()
    holder = start(hold_shard_lock, path, "write", ready, release)
    try:
        assert ready.wait(60), "the lock holder did not start"
        timer = threading.Timer(0.5, release.set)
        timer.start()
        _, elapsed = timed(lambda: cache.set("k", "new"))
        timer.join(30)
    finally:
        release.set()
        assert join_all([holder], 60) == [0]
    assert elapsed >= 0.4
    assert cache.get("k") == "new"
    stats = cache.stats()
    assert stats["lock_waits"] == 1 and stats["give_ups"] == 0


def test_retry_policy_bounds() -> None:
    """worst_case() bounds every attempt plus the largest jittered back-offs."""
    policy = RetryPolicy(lock_timeout=0.3, retries=3, backoff=0.1)
    delays = [policy.backoff_delay(n) for n in range(3) for _ in range(200)]
    assert all(0.05 * 2**(i // 200) <= d <= 0.15 * 2**(i // 200) for i, d in enumerate(delays))
    assert policy.worst_case() >= 4 * 0.3 + 1.5 * (0.1 + 0.2 + 0.4)
    assert RetryPolicy(0, 0, 0).worst_case() < 0.01


# -- one busy shard does not stop the others ------------------------------------------


@pytest.mark.slow
def test_other_shards_serve_without_waiting_while_one_is_locked(
    locked_setup: Callable[..., Any]
) -> None:
    cache, path = locked_setup()
    index = shard_of(cache, "k")
    others = keys_elsewhere(cache, index, 24)
    cache.set_many({k: f"v-{k}" for k in others})
    cache.close_connections()
    with shard_locked(path, "exclusive"):
        for key in others:
            assert cache.get(key) == f"v-{key}"
            cache.set(key, f"w-{key}")
            assert cache.get(key) == f"w-{key}"
        assert cache.stats()["lock_waits"] == 0


@pytest.mark.slow
def test_get_many_returns_the_reachable_shards_values_while_one_is_locked(
    locked_setup: Callable[..., Any]
) -> None:
    """A locked shard's keys are misses; the other shards' keys are still returned."""
    cache, path = locked_setup()
    others = keys_elsewhere(cache, shard_of(cache, "k"), 24)
    cache.set_many({k: f"v-{k}" for k in others})
    cache.close_connections()
    with shard_locked(path, "exclusive"):
        found = cache.get_many(["k", *others])
        assert found == {k: f"v-{k}" for k in others}
        assert cache.stats()["give_ups"] == 1


@pytest.mark.slow
def test_get_many_raises_with_raise_on_timeout(locked_setup: Callable[..., Any]) -> None:
    cache, path = locked_setup(RAISE_ON_TIMEOUT=True)
    others = keys_elsewhere(cache, shard_of(cache, "k"), 8)
    cache.close_connections()
    with shard_locked(path, "exclusive"), pytest.raises(ShardLockTimeout):
        cache.get_many(["k", *others])


@pytest.mark.slow
def test_batch_writes_raise_with_raise_on_timeout(locked_setup: Callable[..., Any]) -> None:
    """The module docstring of the adapter: ``set_many`` returns the keys it could
    not store, *unless* RAISE_ON_TIMEOUT asks for ShardLockTimeout; the same holds
    for ``delete_many``, which otherwise reports nothing."""
    cache, path = locked_setup(RAISE_ON_TIMEOUT=True)
    others = keys_elsewhere(cache, shard_of(cache, "k"), 8)
    with shard_locked(path, "write"):
        with pytest.raises(ShardLockTimeout):
            cache.set_many({"k": "new", **{k: "v" for k in others}})
        with pytest.raises(ShardLockTimeout):
            cache.delete_many(["k", *others])
        with pytest.raises(ShardLockTimeout):
            cache.clear()
    assert cache.get("k") is None  # voided by the failed write (test_sqlite_failed_writes.py)


@pytest.mark.slow
def test_clear_empties_the_reachable_shards_while_one_is_locked(
    locked_setup: Callable[..., Any]
) -> None:
    cache, path = locked_setup()
    others = keys_elsewhere(cache, shard_of(cache, "k"), 24)
    cache.set_many({k: "v" for k in others})
    with shard_locked(path, "write"):
        cache.clear()  # does not raise without RAISE_ON_TIMEOUT
        assert cache.stats()["give_ups"] == 1
    assert cache.get_many(others) == {}
    assert cache.get("k") is None  # voided by the failed write (test_sqlite_failed_writes.py)


def test_removed_cache_directory_fails_softly(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    """Someone deletes LOCATION under a running cache (a tmp cleaner, an operator):
    reads miss and writes report failure, counted as errors; nothing raises."""
    cache = make_cache()
    cache.set("k", "v")
    cache.set("n", 1)
    cache.close_connections()
    shutil.rmtree(cache_dir)
    assert cache.get("k", "default") == "default"
    assert cache.get_many(["k", "other"]) == {}
    assert cache.has_key("k") is False
    assert cache.set("k", "new") is None
    assert cache.add("fresh", 1) is False
    assert cache.delete("k") is False
    assert cache.touch("k") is False
    assert cache.set_many({"a": 1, "b": 2}) != []
    cache.delete_many(["a", "b"])
    with pytest.raises(CacheUnavailable):
        cache.incr("n")
    assert cache.stats()["errors"] >= 8
    assert cache.stats()["give_ups"] == 0


@pytest.mark.slow
def test_set_many_and_delete_many_reach_every_other_shard(
    locked_setup: Callable[..., Any]
) -> None:
    cache, path = locked_setup()
    index = shard_of(cache, "k")
    same = keys_in_shard(cache, index, 3, prefix="same")
    others = keys_elsewhere(cache, index, 24)
    cache.set_many({k: "old" for k in others})
    with shard_locked(path, "write"):
        failed = cache.set_many({k: "new" for k in [*same, *others]})
        assert sorted(failed) == sorted(same)
        assert cache.get_many(others) == {k: "new" for k in others}
        cache.delete_many(["k", *others])
        assert cache.get_many(others) == {}
    assert cache.get("k") is None  # voided by the failed write (test_sqlite_failed_writes.py)


# -- corrupt shard files -----------------------------------------------------------------


def damage(path: str, how: str) -> None:
    size = os.path.getsize(path)
    if how == "garbage":
        with open(path, "r+b") as f:
            f.write(os.urandom(size))
    elif how == "truncated":
        os.truncate(path, size // 2)
    elif how == "pages":  # header kept, every later page overwritten
        with open(path, "r+b") as f:
            f.seek(4096)
            f.write(b"\xa5" * (size - 4096))
    else:
        raise ValueError(how)


@pytest.fixture
def damaged_shard(make_cache: Callable[..., ShardedSQLiteCache]) -> Callable[..., Any]:
    """Fill a 4-shard cache, close it, damage one shard file; return the pieces:
    the data, the keys in the damaged shard, the others, its path, the writer."""

    def setup(how: str) -> tuple[dict[str, str], list[str], list[str], str,
                                 ShardedSQLiteCache]:
        cache = make_cache({"SHARDS": 4, "MAX_ENTRIES": None})
        data = {f"key{i}": f"value{i}-" + "x" * 300 for i in range(400)}
        cache.set_many(data)
        index = shard_of(cache, "key0")
        in_shard = [k for k in data if shard_of(cache, k) == index]
        elsewhere = [k for k in data if shard_of(cache, k) != index]
        path = cache._store.shards[index].path
        cache.close_connections()  # last connection: the WAL is checkpointed away
        assert not os.path.exists(path + "-wal")
        damage(path, how)
        return data, in_shard, elsewhere, path, cache

    return setup


@pytest.mark.parametrize("opened_by", ["new-instance", "same-instance"])
@pytest.mark.parametrize("how", ["garbage", "truncated", "pages"])
def test_corrupt_shard_is_set_aside_and_replaced(
    damaged_shard: Callable[..., Any], make_cache: Callable[..., ShardedSQLiteCache],
    how: str, opened_by: str
) -> None:
    """Found at start-up (a new instance counts every shard) or on first use
    (the instance that wrote the data, reconnecting after close_connections())."""
    data, in_shard, elsewhere, path, writer = damaged_shard(how)
    if opened_by == "new-instance":
        cache = make_cache({"SHARDS": 4, "MAX_ENTRIES": None})  # must not raise
    else:
        cache = writer
        cache._store.stats.reset()
    for key in in_shard:  # misses, never exceptions or wrong values
        assert cache.get(key, "default") in ("default", data[key])
    assert cache.get_many(in_shard) == {}
    assert cache.get_many(elsewhere) == {k: data[k] for k in elsewhere}
    assert cache.stats()["corruptions"] == 1
    aside = list(Path(path).parent.glob(Path(path).name + ".corrupt-*"))
    assert [p for p in aside if not p.name.endswith(("-wal", "-shm"))], aside
    # The new shard works, and is a real SQLite file in place of the old one.
    cache.set(in_shard[0], "again")
    assert cache.get(in_shard[0]) == "again"
    assert cache.entry_count() == len(elsewhere) + 1


def test_corrupt_shard_keeps_the_damaged_bytes_for_the_operator(
    damaged_shard: Callable[..., Any], make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    path = damaged_shard("garbage")[3]
    before = Path(path).read_bytes()
    make_cache({"SHARDS": 4, "MAX_ENTRIES": None})
    (aside,) = Path(path).parent.glob(Path(path).name + ".corrupt-*")
    assert aside.read_bytes() == before


def test_second_quarantine_in_the_same_second_keeps_both_files(
    damaged_shard: Callable[..., Any], make_cache: Callable[..., ShardedSQLiteCache],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is deleted: a second corrupt copy must not replace the first one."""
    monkeypatch.setattr("djcachebench.store.layout.time.strftime",
                        lambda *_: "20260101T000000")
    _, in_shard, _, path, _ = damaged_shard("garbage")
    first = make_cache({"SHARDS": 4, "MAX_ENTRIES": None})
    first.set(in_shard[0], "x" * 5000)
    first.close_connections()
    damage(path, "garbage")
    second = make_cache({"SHARDS": 4, "MAX_ENTRIES": None})
    assert second.get(in_shard[0]) is None
    aside = [p for p in Path(path).parent.glob(Path(path).name + ".corrupt-*")
             if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 2, aside


@pytest.mark.slow
def test_a_call_that_meets_a_locked_shard_many_times_waits_one_policy(
        locked_setup: Callable[..., Any]) -> None:
    """Under MAX_ENTRIES, set_many writes key by key; a call's waits share one
    budget of worst_case(), so 20 keys of a locked shard do not wait 20 times
    worst_case()."""
    cache, path = locked_setup(MAX_ENTRIES=10)  # near the limit: key by key
    batch = keys_in_shard(cache, shard_of(cache, "k"), 20, prefix="many")
    with shard_locked(path, "write"):
        failed, elapsed = timed(lambda: cache.set_many(dict.fromkeys(batch, "v")))
        assert sorted(failed) == sorted(batch)
        assert elapsed < cache._store.policy.worst_case() + 2.0, f"waited {elapsed:.3f}s"
        assert cache.stats()["give_ups"] >= 1
    assert cache.set_many(dict.fromkeys(batch, "v")) == []
    assert cache.get(batch[-1]) == "v"


@pytest.mark.slow
@pytest.mark.parametrize("call", ["get_or_set", "incr_version", "tiered get_or_set"])
def test_get_or_set_and_incr_version_wait_one_budget_not_one_per_write(
        locked_setup: Callable[..., Any], call: str) -> None:
    """With every shard locked, ``get_or_set`` of a callable waits one budget in
    all, not one for its lease ``add`` and another for its value's (2x the bound
    the settings promise); ``incr_version`` likewise, not one for its set and one
    for its delete. A computation's own time is not a wait."""
    options = {"SHARDS": 1, "LOCK_TIMEOUT": 2.0, "RETRIES": 0, "MAX_ENTRIES": None}
    cache, path = locked_setup(**options)
    bound = cache._store.policy.worst_case()
    if call == "tiered get_or_set":  # the same writes, through a TieredCache over it
        from djcachebench.backends.tiered import TieredCache

        cache = TieredCache("", {"OPTIONS": {"L2": {  # type: ignore[assignment]
            "BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
            "LOCATION": cache.location, "OPTIONS": {**POLICY, **options}}}})

    def compute() -> str:
        time.sleep(0.5)
        return "computed"

    with shard_locked(path, "write"):
        if call.endswith("get_or_set"):
            got, elapsed = timed(lambda: cache.get_or_set("missing", compute))
            assert got == "computed"
            elapsed -= 0.5
        else:
            _, elapsed = timed(lambda: cache.incr_version("k"))
        assert elapsed < bound + 1.5, f"waited {elapsed:.3f}s, bound {bound:.3f}s"
