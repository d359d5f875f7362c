"""What a value's tag binds: the key's length, and the serializer that made it.

Both bindings guard against a writer with access to the shard files (the
threat the tags are for); without either, that writer's payload reaches
``pickle.loads``:

* a short-value tag over ``key || domain || payload``, with nothing to say
  where the key ends, would give a row of key ``":1:v\\x00<pickle>"`` holding an
  empty string the tag of a pickle stored under ``":1:v"``;
* with every serializer sealing under one domain, the ``kind`` column (not
  tagged) alone would say which one wrote a row: a msgpack row whose bytes also
  parse as a pickle, relabelled, would be unpickled by a process using pickle.

Each attack below creates a marker file if its payload is ever unpickled.
"""

from __future__ import annotations

import pickle
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.serializers import RAW_BYTES, RAW_INT, RAW_STR, Sealer, serialized_domain

from .helpers import shard_path

_marks: list[str] = []


def record(note: str) -> str:
    """Called by the payloads below if they are ever unpickled."""
    _marks.append(note)
    return note


def _ascii_pickle_calling_record(note: str) -> str:
    """A protocol-0 pickle (ASCII, so it can sit inside a str key) that calls
    :func:`record`; checked to be live."""
    text = f"c{__name__}\nrecord\n(S'{note}'\ntR."
    before = len(_marks)
    assert pickle.loads(text.encode()) == note and len(_marks) == before + 1
    del _marks[before:]
    return text


def _plant(cache: ShardedSQLiteCache, key: str, kind: int, value: bytes) -> None:
    """Store a row for Django key ``key`` behind the cache's back."""
    final = cache.make_key(key)
    with sqlite3.connect(shard_path(cache, key)) as conn:
        conn.execute(
            "INSERT OR REPLACE INTO cache (key, expires, stored, created, kind, value, size) "
            "VALUES (?, NULL, 1, 1, ?, ?, ?)", (final, kind, value, len(value)))
    conn.close()
    cache.close_connections()


def test_a_row_cannot_borrow_the_tag_of_a_longer_key(
        make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache({"SHARDS": 1})
    evil = _ascii_pickle_calling_record("borrowed")
    long_key = "v\x00" + evil
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Django warns about the control character
        cache.set(long_key, "")  # the site caches an empty str under a key a visitor chose
        final = cache.make_key(long_key)
    with sqlite3.connect(shard_path(cache, "v")) as conn:
        kind_str, sealed = conn.execute("SELECT kind, value FROM cache WHERE key = ?",
                                        (final,)).fetchone()
    conn.close()
    # ":1:v" + (str domain) + b"" spelled ":1:v\x00<pickle>" + b"\x02" under the old
    # tag: the same tag, on a row of key ":1:v" of kind pickle, payload <pickle> + b"\x02".
    tag = sealed[:16]
    pickle_kind = cache._store.codec._kind
    assert pickle_kind != kind_str
    _plant(cache, "v", pickle_kind, tag + evil.encode() + RAW_STR)
    before = cache.stats()["tampered"]
    assert cache.get("v", "MISS") == "MISS"
    assert _marks == []
    assert cache.stats()["tampered"] == before + 1


def test_a_msgpack_row_relabelled_as_pickle_is_not_unpickled(
        make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path) -> None:
    msgpack = pytest.importorskip("msgpack")
    packer = make_cache({"SERIALIZER": "msgpack", "SHARDS": 1})
    pickler = make_cache({"SERIALIZER": "pickle", "SHARDS": 1}, location=cache_dir)
    attack = "0" + _ascii_pickle_calling_record("relabelled")
    # A map of 12 entries packs as 0x8c, pickle's SHORT_BINUNICODE, whose length
    # byte is the first key's str8 header (0xd9 = 217): the 127-byte key and
    # the next value's header are read as that string, then the pickle stream
    # goes on inside the value, where the visitor's text sits.
    first = "a" * 127
    value_text = "x" * (217 - 1 - 127 - 2) + attack
    value_text += "y" * max(0, 0x80 - len(value_text))
    assert 0x80 <= len(value_text) <= 0xBF
    data: dict[str, object] = {first: value_text, **{f"k{i}": i for i in range(11)}}
    packed = msgpack.packb(data, use_bin_type=True)
    assert packed[:2] == b"\x8c\xd9"
    packer.set("profile", data)
    assert packer.get("profile") == data
    with sqlite3.connect(shard_path(packer, "profile")) as conn:
        assert conn.execute("UPDATE cache SET kind = ? WHERE key = ?",
                            (pickler._store.codec._kind,
                             packer.make_key("profile"))).rowcount == 1
    conn.close()
    pickler.close_connections()
    before = pickler.stats()["tampered"]
    assert pickler.get("profile", "MISS") == "MISS"
    assert _marks == []
    assert pickler.stats()["tampered"] == before + 1


def test_each_serializer_seals_under_a_domain_of_its_own() -> None:
    names = ["djcachebench.serializers.PickleSerializer",
             "djcachebench.serializers.MsgpackSerializer", "myapp.serializers.Json",
             "myapp.serializers.Yaml"]
    domains = [serialized_domain(n) for n in names]
    assert len(set(domains)) == len(domains)
    raw = [RAW_BYTES, RAW_STR, RAW_INT]
    # No domain is a prefix of another (the tag input stays unambiguous).
    for a in domains + raw:
        for b in domains + raw:
            assert a == b or not b.startswith(a)
    sealer = Sealer(b"k" * 32)
    sealed = sealer.seal(":1:k", b"payload", domains[2])
    assert sealer.open(":1:k", sealed, domains[2]) == b"payload"
    assert sealer.open(":1:k", sealed, domains[3]) is None


def test_a_key_and_payload_split_differently_give_different_tags() -> None:
    sealer = Sealer(b"k" * 32)
    assert sealer.tag(":1:ab", b"c", RAW_BYTES) != sealer.tag(":1:a", b"bc", RAW_BYTES)
    assert (sealer.tag(":1:v\x00X", b"", RAW_STR)
            != sealer.tag(":1:v", b"X" + RAW_STR, serialized_domain("pickle")[:1]))


def test_a_shard_sealed_under_the_old_tags_is_emptied_when_upgraded(
        make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path) -> None:
    """Format 5 rows cannot be told from forgeries: the upgrade drops them (and
    their counts), and the cache works on."""
    cache = make_cache({"SHARDS": 1})
    cache.set("old", "value")
    path = shard_path(cache, "old")
    cache.close_connections()
    with sqlite3.connect(path) as conn:  # as format 5 left it: no tag_format table
        conn.execute("DROP TABLE tag_format")
    conn.close()
    manifest = cache_dir / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"version": 6', '"version": 5'))
    again = make_cache({"SHARDS": 1})
    assert again.get("old", "MISS") == "MISS"
    assert again.stats()["tampered"] == 0  # dropped, not read as a forgery
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM cache").fetchone()[0] == 0
        assert conn.execute("SELECT entries FROM meta").fetchone()[0] == 0
    conn.close()
    again.set("new", "value")
    assert again.get("new") == "value"
    assert '"version": 6' in manifest.read_text()
