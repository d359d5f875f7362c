"""Whoever can write a shard can name anything, and alter bytes already verified.

The integrity tag vouches for a value only after it was read, and the file's
name and size come from the row before that. Each test of the first part
plants one such row (or file) and failed on the code before the fix: a name
that is a path had its file deleted once the row was replaced, a size of 32 TiB
raised MemoryError out of ``get``, and a FIFO under a value's name blocked
``get`` forever. The second part alters bytes in place after processes
verified them (see its comment).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.codec import LARGE_MIN

from .helpers import raw_shard, shard_path

BIG = b"x" * (LARGE_MIN + 10)


def _set_column(cache: ShardedSQLiteCache, key: str, column: str, value: object) -> None:
    with raw_shard(shard_path(cache, key)) as conn:
        conn.execute(f"UPDATE cache SET {column} = ? WHERE key = ?",
                     (value, cache.make_key(key)))


def _churn(cache: ShardedSQLiteCache) -> None:
    """Writes that replace and delete file values, so that every shard collects
    the names its rows released."""
    for i in range(64):
        cache.set(f"churn{i}", BIG)
        cache.delete(f"churn{i}")


@pytest.mark.parametrize("planted", ["absolute", "relative"])
def test_a_name_that_is_a_path_is_never_read_or_removed(
        cache: ShardedSQLiteCache, tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache.set("k", BIG)
    # A relative name's first two characters are its directory: "../../victim"
    # was <values>/<shard>/../../../victim, that is <values>/../../victim.
    name = str(victim) if planted == "absolute" else os.path.relpath(
        victim, Path(cache.location) / "values")
    _set_column(cache, "k", "file", name)
    assert cache.get("k", "default") == "default"
    cache.set("k", b"replaced")  # the old name is released...
    cache.delete("k")
    _churn(cache)  # ...and collected
    cache.clear()
    assert victim.read_text() == "precious"
    cache.set("k", BIG)
    assert cache.get("k") == BIG


def test_a_size_larger_than_the_file_is_a_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", BIG)
    _set_column(cache, "k", "size", 2**45)
    assert cache.get("k", "default") == "default"
    assert cache.get_many(["k"]) == {}
    cache.set("k", BIG)
    assert cache.get("k") == BIG


def test_a_fifo_under_a_values_name_is_a_prompt_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", BIG)
    with raw_shard(shard_path(cache, "k")) as conn:
        (name,) = conn.execute("SELECT file FROM cache WHERE key = ?",
                               (cache.make_key("k"),)).fetchone()
    path = cache._store.shards[cache._store.route(cache.make_key("k"))].files.path(name)
    os.unlink(path)
    os.mkfifo(path)
    start = time.monotonic()
    assert cache.get("k", "default") == "default"  # before the fix: blocked in open()
    assert time.monotonic() - start < 5


# -- bytes altered in place, after this process verified them ----------------------
#
# A process that verified a long row or a value file used to trust it by its
# version (the row's ``stored``) or by the file's name, so bytes altered in
# place afterwards, that column or name kept, were returned as they were (raw
# bytes or text: an HTML fragment could be rewritten). Now a long row is
# vouched for by a keyed fingerprint of the bytes read and a file by its
# identity (inode, size, modification and change times). Both tests below fail
# on the code before on the raw values; the pickled ones pin that nothing
# unverified is ever unpickled.

ROW_VALUES = {"raw": b"r" * 10_000, "text": "<p>page</p>" * 1000,
              "pickled": {"rows": list(range(2000))}}


def _alter_blob(cache: ShardedSQLiteCache, key: str, value: object) -> None:
    """Replace the row's bytes in ``blobs`` with ``value``'s as another codec
    sealed them; ``stored`` (the row's version) is left as it was."""
    other = ShardedSQLiteCache(str(cache.location) + "-other", {"OPTIONS": {
        "INTEGRITY_KEY": "not this cache's key"}})
    _, forged, _ = other._store.codec.encode(cache.make_key(key), value)
    with raw_shard(shard_path(cache, key)) as conn:
        (blob,) = conn.execute("SELECT blob FROM cache WHERE key = ?",
                               (cache.make_key(key),)).fetchone()
        assert blob is not None
        conn.execute("UPDATE blobs SET value = ? WHERE id = ?", (forged, blob))


@pytest.mark.parametrize("kind", list(ROW_VALUES))
def test_a_long_row_altered_in_place_is_refused_after_it_verified(
        cache: ShardedSQLiteCache, tmp_path: Path, kind: str) -> None:
    value = ROW_VALUES[kind]
    cache.set("k", value)
    reader = ShardedSQLiteCache(str(cache.location), {})  # another process, in effect
    for _ in range(3):
        assert reader.get("k") == value
        assert cache.get("k") == value
    altered: object = {"raw": b"r" * 9_996 + b"EVIL", "text": ROW_VALUES["text"][:-4] + "EVIL",
                       "pickled": {"rows": "evil"}}[kind]
    _alter_blob(cache, "k", altered)
    assert reader.get("k", "default") == "default"
    assert cache.get("k", "default") == "default"
    assert reader.stats()["tampered"] == 1


@pytest.mark.parametrize("kind", ["raw", "text", "pickled"])
def test_a_value_file_altered_in_place_is_refused_after_it_verified(
        cache: ShardedSQLiteCache, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from djcachebench.store import values
    monkeypatch.setattr(values, "SETTLE_NS", 0)  # readers remember young files too
    value: object = {"raw": BIG, "text": BIG.decode(), "pickled": {"pad": BIG}}[kind]
    cache.set("k", value)
    reader = ShardedSQLiteCache(str(cache.location), {})
    for _ in range(3):
        assert reader.get("k") == value
        assert cache.get("k") == value
    with raw_shard(shard_path(cache, "k")) as conn:
        (name,) = conn.execute("SELECT file FROM cache WHERE key = ?",
                               (cache.make_key("k"),)).fetchone()
    path = Path(cache._store.shards[cache._store.route(cache.make_key("k"))].files.path(name))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    time.sleep(0.01)  # a later clock tick, even where timestamps are coarse
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.write(bytes(data))
    assert reader.get("k", "default") == "default"
    assert cache.get("k", "default") == "default"


def test_a_fixed_hash_seed_turns_fingerprints_off() -> None:
    """Where PYTHONHASHSEED fixes the key of Python's hash, the fingerprint
    could be forged: every long row is then verified by its tag."""
    import subprocess
    import sys
    code = "from djcachebench.store.codec import FINGERPRINTS; print(FINGERPRINTS)"
    for seed, expected in (("123", "False"), ("0", "False"), ("random", "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        assert out.stdout.strip() == expected, seed
