"""Two SECRET_KEYs on one LOCATION: a rolling key rotation destroys nothing.

Pinned (docs/settings.md "INTEGRITY_KEY", store/codec.py): values are sealed
with the key derived from ``SECRET_KEY`` and accepted when they verify under it
or under one derived from a ``SECRET_KEY_FALLBACKS`` entry, as Django's signing
does. A row that verifies under none of a process's keys is a miss for that
process (never unpickled), but it stays: reading it does not delete it, and
while it is live ``add`` does not treat the key as absent, so during a
rotation both sides can never win the same ``add`` lock. An explicit
``INTEGRITY_KEY`` is not derived from ``SECRET_KEY``: the fallbacks do not
apply to it.

The key is read when the backend is built, so instances built under different
settings play the processes on each side of the rotation; one test uses a
real second process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import SPAWN, join_all, raw_shard, shard_path, start
from .workers import rotated_key_worker

OLD = "old-secret-key-djcachebench-0123456789"
NEW = "new-secret-key-djcachebench-9876543210"
VALUES: dict[str, Any] = {"text": "a str value", "raw": b"some bytes", "obj": {"n": [1, 2]}}


def build(make_cache: Callable[..., ShardedSQLiteCache], settings: Any, secret_key: str,
          fallbacks: list[str] | None = None,
          options: dict[str, Any] | None = None) -> ShardedSQLiteCache:
    """A backend built while SECRET_KEY / SECRET_KEY_FALLBACKS are as given."""
    settings.SECRET_KEY = secret_key
    settings.SECRET_KEY_FALLBACKS = fallbacks or []
    return make_cache(options)


def row_count(cache: ShardedSQLiteCache, key: str) -> int:
    with raw_shard(shard_path(cache, key)) as conn:
        return conn.execute("SELECT count(*) FROM cache WHERE key = ?",
                            (cache.make_key(key),)).fetchone()[0]


def test_new_key_with_the_old_as_fallback_reads_old_values(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any
) -> None:
    old = build(make_cache, settings, OLD)
    old.set_many(VALUES)
    new = build(make_cache, settings, NEW, [OLD])
    assert {k: new.get(k) for k in VALUES} == VALUES
    assert new.get_many(list(VALUES)) == VALUES
    assert all(new.has_key(k) for k in VALUES)
    assert new.add("text", "taken") is False
    assert new.stats()["tampered"] == 0
    # What the new side writes is sealed with the new key only: it reads it, and
    # an old-side process without the new key sees a miss (but the row stays).
    new.set("written-by-new", VALUES["obj"])
    assert new.get("written-by-new") == VALUES["obj"]
    assert old.get("written-by-new") is None
    assert row_count(old, "written-by-new") == 1


def test_a_key_without_fallback_gets_a_miss_and_leaves_the_row(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any
) -> None:
    old = build(make_cache, settings, OLD)
    old.set_many(VALUES)
    new = build(make_cache, settings, NEW)  # no fallback
    assert new.get("obj", "miss") == "miss"
    assert new.get_many(list(VALUES)) == {}
    assert new.has_key("text") is False
    assert new.stats()["tampered"] >= len(VALUES)
    # Nothing was deleted by those reads: the old side still reads every value.
    assert all(row_count(old, k) == 1 for k in VALUES)
    assert {k: old.get(k) for k in VALUES} == VALUES


def test_neither_side_wins_add_while_the_other_sides_row_is_live(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any
) -> None:
    old = build(make_cache, settings, OLD)
    new = build(make_cache, settings, NEW)  # no fallback
    assert old.add("lock", "held by old", timeout=60) is True
    assert new.add("lock", "held by new", timeout=60) is False
    assert new.add("lock", "held by new", timeout=0) is False  # Django: fails on a live key
    assert old.get("lock") == "held by old"
    assert new.add("other-lock", "held by new", timeout=60) is True
    assert old.add("other-lock", "held by old", timeout=60) is False
    assert new.get("other-lock") == "held by new"


def test_an_expired_row_of_the_other_side_does_not_block_add(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any
) -> None:
    old = build(make_cache, settings, OLD)
    new = build(make_cache, settings, NEW)
    old.set("lock", "held by old", timeout=60)
    with raw_shard(shard_path(old, "lock")) as conn:
        conn.execute("UPDATE cache SET expires = 1.0 WHERE key = ?", (old.make_key("lock"),))
    assert new.add("lock", "held by new") is True
    assert new.get("lock") == "held by new"


def test_explicit_integrity_key_ignores_secret_key_fallbacks(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any
) -> None:
    """INTEGRITY_KEY replaces the SECRET_KEY derivation, so SECRET_KEY's fallbacks
    (which are about SECRET_KEY) do not widen what it accepts."""
    build(make_cache, settings, OLD).set("k", VALUES["obj"])
    explicit = build(make_cache, settings, NEW, [OLD],
                     {"INTEGRITY_KEY": "an-explicit-integrity-key-0123"})
    assert explicit.get("k") is None
    assert explicit.stats()["tampered"] == 1


@pytest.mark.slow
def test_a_process_with_another_key_neither_reads_nor_destroys_nor_takes_the_lock(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any, cache_dir: Path
) -> None:
    old = build(make_cache, settings, OLD)
    old.set("lock", "held by old", timeout=120)
    old.set("value", VALUES["obj"])
    outcomes = {}
    for name, fallbacks in (("without-fallback", []), ("with-fallback", [OLD])):
        receive, send = SPAWN.Pipe(duplex=False)
        proc = start(rotated_key_worker, str(cache_dir), {}, NEW, fallbacks, "lock", send)
        outcomes[name] = receive.recv() if receive.poll(120) else None
        assert join_all([proc]) == [0]
    assert outcomes["without-fallback"] == {
        "get": "<miss>", "has_key": False, "add": False, "tampered": 2}
    assert outcomes["with-fallback"] == {
        "get": "held by old", "has_key": True, "add": False, "tampered": 0}
    assert old.get("lock") == "held by old"
    assert old.get("value") == VALUES["obj"]


@pytest.mark.parametrize("value", [b"x" * 40_000, {"pad": "x" * 40_000}], ids=["raw", "pickled"])
def test_a_value_file_verified_under_a_fallback_is_not_vouched_for_to_the_host(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any,
    monkeypatch: pytest.MonkeyPatch, value: Any
) -> None:
    """A process with the new key and the old as fallback that verifies a value
    file sealed under the old key must not vouch for it on the host's board,
    which every process with the new key reads: else a process that dropped the
    old key (because it leaked) returns, and unpickles, that file on the other's
    word."""
    from djcachebench.store import values
    monkeypatch.setattr(values, "SETTLE_NS", 0)  # any file may be vouched for
    old = build(make_cache, settings, OLD)
    old.set("k", value)  # a value file (32 KiB or more), sealed under the old key
    dropped = build(make_cache, settings, NEW)
    assert dropped.get("k", "miss") == "miss"
    rotating = build(make_cache, settings, NEW, [OLD])
    assert rotating.get("k") == value
    assert rotating.get("k") == value  # its own memo still accepts it
    assert build(make_cache, settings, NEW).get("k", "miss") == "miss"
    assert dropped.get("k", "miss") == "miss"
    # A file sealed under the current key is still vouched for across processes.
    rotating.set("mine", value)
    assert rotating.get("mine") == value
    reader = build(make_cache, settings, NEW)
    assert reader.get("mine") == value and reader.stats()["file_vouched"] == 1


@pytest.mark.parametrize(("secret_key", "fallbacks", "named"), [
    (NEW, OLD, "SECRET_KEY_FALLBACKS has type str"),
    (NEW, [OLD, 5], "SECRET_KEY_FALLBACKS[1] has type int"),
    (NEW, [OLD, "old\ud800key-0123456789"], "SECRET_KEY_FALLBACKS[1] cannot be encoded"),
    ("new\udc00key-0123456789abcdef", [], "SECRET_KEY cannot be encoded"),
])
def test_keys_django_cannot_sign_with_are_refused_by_name(
    make_cache: Callable[..., ShardedSQLiteCache], settings: Any, secret_key: str,
    fallbacks: Any, named: str
) -> None:
    """``SECRET_KEY_FALLBACKS = "old-key"`` (a str, not a list) would make every
    character a fallback key, so a value planted on disk sealed under ``b"o"``
    would be unpickled and served; ``[5]`` and a lone surrogate would raise a
    bare ``TypeError`` / ``UnicodeEncodeError`` while the cache is built. Each is
    refused with ImproperlyConfigured naming the setting."""
    from django.core.exceptions import ImproperlyConfigured

    settings.SECRET_KEY = secret_key
    settings.SECRET_KEY_FALLBACKS = fallbacks
    with pytest.raises(ImproperlyConfigured) as raised:
        make_cache()
    assert named in str(raised.value)
    assert "old" not in str(raised.value)  # the keys themselves are never shown
