"""Values too long for the key's row live in the shard's ``blobs`` table.

Pinned (docs/architecture.md "Values in blobs", store/codec.py ``INLINE_MAX``):
a sealed value longer than ``INLINE_MAX`` (less its key's length) and shorter
than ``LARGE_MIN`` is written to ``blobs`` in the same transaction as the row
that names it; whatever replaces, deletes, culls, expires or clears the row
drops the blob with it (triggers), so no blob is ever left that no row names,
even when writers are SIGKILLed. A blob altered on disk reads as a miss, and a
directory of format 4 (before ``blobs``) is upgraded in place.
"""

from __future__ import annotations

import json
import pickle
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.codec import INLINE_MAX, LARGE_MIN
from djcachebench.store.layout import FORMAT_VERSION

from .helpers import (
    PATIENT,
    TouchOnUnpickle,
    integrity_check,
    kill_writers,
    raw_shard,
    shard_files,
    shard_of,
    shard_path,
)
from .workers import blob_value_writer

MID = b"m" * 10_000  # between INLINE_MAX and LARGE_MIN
SMALL = b"s" * 100


def where(cache: ShardedSQLiteCache, key: str) -> tuple[bool, bool, bool]:
    """(value in the row, value in blobs, value in a file) for a stored key."""
    with raw_shard(shard_path(cache, key)) as conn:
        value, blob, file = conn.execute(
            "SELECT value, blob, file FROM cache WHERE key = ?", (cache.make_key(key),)
        ).fetchone()
    return (value is not None and file is None, blob is not None, file is not None)


def blob_ids(location: Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """((shard, id) in ``blobs``, (shard, id) that rows name), every shard, sorted."""
    held: list[tuple[str, int]] = []
    named: list[tuple[str, int]] = []
    for path in shard_files(location):
        with raw_shard(path) as conn:
            held += [(path.name, r[0]) for r in conn.execute("SELECT id FROM blobs")]
            named += [(path.name, r[0])
                      for r in conn.execute("SELECT blob FROM cache WHERE blob IS NOT NULL")]
    return sorted(held), sorted(named)


@pytest.mark.parametrize(
    "value",
    [MID, MID.decode() + "é", {"pad": MID, "n": 1}, [b"x" * 500, b"y" * 500]],
    ids=["bytes", "str", "pickled", "just-over"],
)
def test_values_past_the_row_limit_go_to_blobs_and_round_trip(
    cache: ShardedSQLiteCache, value: Any
) -> None:
    cache.set("k", value)
    assert where(cache, "k") == (False, True, False)
    for _ in range(2):  # the second read may come through the verified-row memo
        assert cache.get("k") == value
    assert cache.get_many(["k", "absent"]) == {"k": value}
    assert cache.get_with_expiry("k")[0] == value
    assert cache.has_key("k")


def test_the_threshold_counts_the_key(cache: ShardedSQLiteCache) -> None:
    """A value that fits in the row beside a short key goes to blobs beside a long one."""
    value = b"v" * (INLINE_MAX - 200)
    cache.set("k", value)
    assert where(cache, "k") == (True, False, False)
    long_key = "k" * 220
    cache.set(long_key, value)
    assert where(cache, long_key) == (False, True, False)
    assert cache.get("k") == value and cache.get(long_key) == value


def test_every_way_a_row_goes_drops_its_blob(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache({"MAX_ENTRIES": None})
    cache.set("a", MID)
    cache.set("a", MID + b"2")  # blob to blob
    assert cache.get("a") == MID + b"2"
    cache.set("b", MID)
    cache.set("b", SMALL)  # blob to row
    cache.set("c", MID)
    cache.set("c", b"f" * (LARGE_MIN + 1))  # blob to file
    cache.set("d", SMALL)
    cache.set("d", MID)  # row to blob
    cache.set("e", MID)
    cache.delete("e")
    cache.set_many({"f": MID, "g": MID, "h": SMALL})
    cache.delete_many(["f"])
    cache.set("x", MID, timeout=0.05)
    cache.set("i", 5)
    assert cache.incr("i", 1) == 6  # 8 sealed bytes: stays in the row
    held, named = blob_ids(cache_dir)
    assert held == named and len(held) == 4  # a, d, g, x
    assert cache.add("a", MID) is False  # a live value: the add's blob is dropped
    assert cache.add("new", MID) is True and cache.get("new") == MID
    assert blob_ids(cache_dir)[0] == blob_ids(cache_dir)[1]
    time.sleep(0.1)
    assert cache.get("x") is None
    store = cache._store
    store.run(shard_of(cache, "x"), store._sweep, shard_of(cache, "x"))  # removes expired rows
    held, named = blob_ids(cache_dir)
    assert held == named and len(held) == 4  # a, d, g, new
    cache.clear()
    assert blob_ids(cache_dir) == ([], [])


def test_culling_drops_the_blobs_of_culled_rows(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache({"MAX_ENTRIES": 10, "CULL_FREQUENCY": 2})
    for i in range(40):
        cache.set(f"k{i}", MID)
    held, named = blob_ids(cache_dir)
    assert held == named and len(held) == cache.entry_count() <= 10


def test_incr_of_a_value_in_a_blob(cache: ShardedSQLiteCache) -> None:
    """A number too large for SQL is pickled; past INLINE_MAX it lives in a blob."""
    big = 10**3000
    cache.set("n", big)
    assert where(cache, "n") == (False, True, False)
    assert cache.incr("n", 1) == big + 1 and cache.get("n") == big + 1
    held, named = blob_ids(Path(cache.location))
    assert held == named and len(held) == 1


def test_an_altered_blob_is_a_miss_and_a_pickle_in_it_never_runs(
    cache: ShardedSQLiteCache, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    value = {"pad": MID}
    cache.set("k", value)
    assert cache.get("k") == value  # now in the verified-row memo
    with raw_shard(shard_path(cache, "k")) as conn:
        (stored,) = conn.execute("SELECT value FROM blobs").fetchone()
        evil = pickle.dumps([TouchOnUnpickle(marker), MID])
        forged = stored[:16] + evil  # the tag kept, the payload replaced
        conn.execute("UPDATE blobs SET value = ?", (forged,))
    assert cache.get("k", "default") == "default"
    assert not marker.exists()
    assert cache.stats()["tampered"] == 1
    cache.set("raw", MID)
    with raw_shard(shard_path(cache, "raw")) as conn:
        conn.execute(
            "UPDATE blobs SET value = ? WHERE id = (SELECT blob FROM cache WHERE key = ?)",
            (b"y" * (len(MID) + 16), cache.make_key("raw")),
        )
    other = ShardedSQLiteCache(str(cache.location), {})  # has never verified it
    assert other.get("raw", "default") == "default"


class CountingSealer:
    """Wraps a codec's sealer and counts the tags it checks (``open``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.opens = 0

    def open(self, *args: Any) -> Any:
        self.opens += 1
        return self.inner.open(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_long_raw_value_is_verified_once_per_version(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """A row of SHA_MIN bytes or more is vouched for by the fingerprint of its
    bytes once its tag verified (or once this process wrote it); a new write is
    new bytes, verified again. Bytes under SHA_MIN: the exact-bytes memo."""
    writer, reader = make_cache(), make_cache()
    counting = CountingSealer(reader._store.codec._sealer)
    reader._store.codec._sealer = counting
    many = [f"k{i}" for i in range(100)]
    for key in many:
        writer.set(key, MID)
    for _ in range(3):
        assert reader.get_many(many) == {key: MID for key in many}
    assert counting.opens == len(many)  # the first read of each, then by fingerprint
    writer.set("k0", MID + b"2")
    assert reader.get("k0") == MID + b"2"
    assert counting.opens == len(many) + 1
    counting_writer = CountingSealer(writer._store.codec._sealer)
    writer._store.codec._sealer = counting_writer
    assert writer.get("k0") == MID + b"2" and counting_writer.opens == 0  # it wrote it
    small = b"s" * 1000  # in a blob, but under SHA_MIN: the bytes memo, not fingerprints
    writer.set("small", small)
    assert reader.get("small") == small
    with raw_shard(shard_path(writer, "small")) as conn:
        conn.execute(
            "UPDATE blobs SET value = ? WHERE id = (SELECT blob FROM cache WHERE key = ?)",
            (b"x" * (len(small) + 16), writer.make_key("small")),
        )
    assert reader.get("small", "default") == "default"


def test_sigkilled_writers_leave_no_orphan_blob_and_no_torn_value(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Writers of 1-30 KB values (set, set_many, add, delete) are SIGKILLed at
    random moments. Afterwards every blob is named by exactly one row, the shards
    pass SQLite's integrity check, and every value read back is the key's own."""
    options = {**PATIENT, "SHARDS": 2, "MAX_ENTRIES": 40, "CULL_FREQUENCY": 3}
    make_cache(options)
    seed = random.randrange(2**32)
    kill_writers(blob_value_writer, cache_dir, options, seed)
    held, named = blob_ids(cache_dir)
    assert held == named and len(set(named)) == len(named), f"seed {seed}"
    assert all(integrity_check(p) == "ok" for p in shard_files(cache_dir))
    reader = make_cache(options)
    keys = [f"r{r}w{w}-{k}" for r in range(4) for w in range(3) for k in range(8)]
    found = reader.get_many(keys)
    assert found, f"no value survived (seed {seed})"
    for key, value in found.items():
        assert value.startswith(f"{key}|".encode()), (key, value[:40], seed)
    assert reader.stats()["tampered"] == 0 and reader.stats()["errors"] == 0


# The shard schema of format 4 (commit acddf9b), before ``blobs``.
FORMAT_4_SCHEMA = """
CREATE TABLE cache (key TEXT PRIMARY KEY NOT NULL, expires REAL, stored INTEGER NOT NULL,
    created INTEGER NOT NULL, kind INTEGER NOT NULL, value, size INTEGER NOT NULL,
    file TEXT) WITHOUT ROWID;
CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL, bytes_exact INTEGER NOT NULL DEFAULT 0);
CREATE TABLE garbage (name TEXT PRIMARY KEY NOT NULL, since REAL NOT NULL);
INSERT INTO meta (id, entries, bytes) VALUES (0, 0, 0);
CREATE TRIGGER cache_insert AFTER INSERT ON cache BEGIN
    UPDATE meta SET entries = entries + 1, bytes = bytes + NEW.size WHERE id = 0;
END;
CREATE TRIGGER cache_delete AFTER DELETE ON cache BEGIN
    UPDATE meta SET entries = entries - 1, bytes = bytes - OLD.size WHERE id = 0;
END;
CREATE TRIGGER file_released AFTER DELETE ON cache WHEN OLD.file IS NOT NULL BEGIN
    INSERT OR REPLACE INTO garbage (name, since) VALUES (OLD.file, 0);
END;
"""


def test_a_format_4_directory_is_upgraded_in_place(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, tmp_path: Path
) -> None:
    """Its rows, sealed under the tags before format 6, are dropped (they cannot
    be told from forgeries: test_sqlite_tag_binding.py); values past the row
    limit go to blobs from then on, and its manifest says the current version
    (so code that reads only 4 refuses it)."""
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "manifest.json").write_text(json.dumps(
        {"format": "djcachebench-sqlite", "version": 4, "shards": 8, "hash": "crc32"}))
    sealer = make_cache(location=tmp_path / "elsewhere")  # same integrity key
    old = {"small": SMALL, "mid": MID}  # format 4 kept both in the row
    for i in range(8):
        conn = sqlite3.connect(cache_dir / f"shard-{i:03d}.sqlite3", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(FORMAT_4_SCHEMA)
        for key, value in old.items():
            made = sealer.make_key(key)
            if sealer._store.route(made) == i:
                kind, stored, size = sealer._store.codec.encode(made, value)
                conn.execute(
                    "INSERT INTO cache (key, expires, stored, created, kind, value, size) "
                    "VALUES (?, NULL, 1, 1, ?, ?, ?)", (made, kind, stored, size))
        conn.close()
    cache = make_cache()
    assert json.loads((cache_dir / "manifest.json").read_text())["version"] == FORMAT_VERSION
    assert cache.get_many(list(old)) == {}
    assert cache.stats()["tampered"] == 0
    cache.set("mid", MID)
    cache.set("mid", MID + b"2")  # replaces a row: now in blobs
    cache.set("other", MID)
    assert where(cache, "mid") == (False, True, False)
    assert cache.get("mid") == MID + b"2" and cache.get("other") == MID
    cache.delete("mid")
    held, named = blob_ids(cache_dir)
    assert held == named and len(held) == 1
    assert cache.entry_count() == 1  # "other": the format-4 rows went with the upgrade


def test_size_limit_counts_values_in_blobs(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    limit = 10 * len(MID)
    cache = make_cache({"SIZE_LIMIT": limit, "MAX_ENTRIES": None})
    for i in range(30):
        cache.set(f"k{i}", MID)
        cache.set(f"k{i}", MID + b"!")  # a replacement changes the byte total too
    total = 0
    for path in shard_files(cache_dir):
        with raw_shard(path) as conn:
            total += conn.execute("SELECT coalesce(sum(length(value)), 0) FROM blobs").fetchone()[0]
    assert total <= limit
    assert cache.get("k29") == MID + b"!"
    held, named = blob_ids(cache_dir)
    assert held == named


def test_add_over_an_expired_value_in_a_blob_replaces_it(cache: ShardedSQLiteCache) -> None:
    cache.set("k", MID, timeout=0.05)
    time.sleep(0.1)
    assert cache.add("k", MID + b"2") is True
    assert cache.get("k") == MID + b"2"
    held, named = blob_ids(Path(cache.location))
    assert held == named and len(held) == 1


def test_a_key_with_a_lone_surrogate_keeps_its_value_in_a_blob(
    cache: ShardedSQLiteCache,
) -> None:
    """Such a key is bound as the bytes of its surrogatepass UTF-8 (codec.sql_key),
    in the blob statement's trigger as everywhere else."""
    key = "k\udc80"
    cache.set(key, MID)
    cache.set(key, MID + b"2")  # rewrites the blob the row already names
    assert cache.get(key) == MID + b"2"
    assert cache.get_many([key]) == {key: MID + b"2"}
    held, named = blob_ids(Path(cache.location))
    assert held == named and len(held) == 1
    cache.delete(key)
    assert blob_ids(Path(cache.location)) == ([], [])
