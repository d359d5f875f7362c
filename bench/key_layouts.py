"""How much does a get's SELECT grow from 1,100 to a million keys, per key layout?

Raw SQLite, no cache code: ~100-byte rows in eight shard files per layout and
key count, read by uniformly random keys after a warm-up that fills each
connection's page cache (32 MiB, the engine's ``PAGE_CACHE``), the layouts and
key counts interleaved call by call (a noisy neighbour slows all alike):

* ``text``    the engine's layout: a ``WITHOUT ROWID`` table keyed by the cache
              key (text), the value in the row
* ``hashed``  a rowid table whose rowid is a keyed 64-bit hash of the cache key
              (BLAKE2b, keyed as the engine's tags are), the key kept in the row
              and compared after the read (so a colliding key is a miss, never
              another key's value); the hash is timed with the SELECT

Why: ``bench/get_scale.py --floor`` shows the engine's SELECT alone growing
more, from 1,100 keys to a million, than a 1.5x target leaves a whole get. An
integer B-tree has denser interior pages and compares integers, not strings,
on the way down.

    .venv/bin/python bench/key_layouts.py [--keys 1000000] [--reads 100000]
        [--warm 300000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sqlite3
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from typing import Any

FEW = 1100
SHARDS = 8
VALUE = os.urandom(116)  # a 100-byte value with its tag
HASH_KEY = b"key-layouts-not-a-secret-0123456"
SCHEMAS = {
    "text": "CREATE TABLE cache (key TEXT PRIMARY KEY NOT NULL, expires REAL, "
            "stored INTEGER NOT NULL, kind INTEGER NOT NULL, value, size INTEGER NOT NULL, "
            "file TEXT) WITHOUT ROWID",
    "hashed": "CREATE TABLE cache (id INTEGER PRIMARY KEY, key TEXT NOT NULL, expires REAL, "
              "stored INTEGER NOT NULL, kind INTEGER NOT NULL, value, size INTEGER NOT NULL, "
              "file TEXT)",
}


def route(key: str) -> int:
    return zlib.crc32(key.encode()) % SHARDS


_KEYED = hashlib.blake2b(key=HASH_KEY, digest_size=8)  # copied: keying costs a compression


def hashed(key: str) -> int:
    h = _KEYED.copy()
    h.update(key.encode())
    return int.from_bytes(h.digest(), "little", signed=True)


def shards(root: str, layout: str, keys: int) -> list[sqlite3.Connection]:
    """The eight shards of ``layout`` at ``keys`` keys, made on first use."""
    conns = []
    for s in range(SHARDS):
        path = os.path.join(root, f"{layout}-{keys}-{s}.sqlite3")
        fresh = not os.path.exists(path)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA cache_size = -32768")
        if fresh:
            conn.execute(SCHEMAS[layout])
            conn.execute("BEGIN")
            for i in range(keys):
                key = f":1:pre{i}"
                if route(key) != s:
                    continue
                if layout == "text":
                    conn.execute("INSERT INTO cache VALUES (?, NULL, ?, 4, ?, 116, NULL)",
                                 (key, i, VALUE))
                else:
                    conn.execute("INSERT OR REPLACE INTO cache VALUES (?, ?, NULL, ?, 4, ?, 116, "
                                 "NULL)", (hashed(key), key, i, VALUE))
            conn.execute("COMMIT")
        conns.append(conn)
    return conns


def reader(root: str, layout: str, keys: int) -> Callable[[str], Any]:
    """One get's SELECT (and, for ``hashed``, its hash and key check)."""
    cursors = [c.cursor() for c in shards(root, layout, keys)]
    if layout == "text":
        def read(key: str) -> Any:
            return cursors[route(key)].execute(
                "SELECT kind, value, expires, file, size FROM cache WHERE key = ?",
                (key,)).fetchone()
    else:
        def read(key: str) -> Any:
            row = cursors[route(key)].execute(
                "SELECT kind, value, expires, file, size, key FROM cache WHERE id = ?",
                (hashed(key),)).fetchone()
            return row if row is not None and row[5] == key else None
    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=100_000)
    parser.add_argument("--warm", type=int, default=300_000)
    parser.add_argument("--dir", help="keep the shard files here (reused when present)")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="key-layouts-")
    os.makedirs(root, exist_ok=True)
    cases = [(layout, n) for layout in SCHEMAS for n in (FEW, args.keys)]
    reads = {case: reader(root, *case) for case in cases}
    rng = random.Random(1)
    for case in cases:
        for _ in range(args.warm):
            assert reads[case](f":1:pre{rng.randrange(case[1])}") is not None
    clock = time.perf_counter_ns
    times: dict[tuple[str, int], list[int]] = {case: [] for case in cases}
    for _ in range(args.reads):
        for case in cases:  # interleaved call by call
            key = f":1:pre{rng.randrange(case[1])}"
            t = clock()
            row = reads[case](key)
            times[case].append(clock() - t)
            assert row is not None
    for layout in SCHEMAS:
        few = statistics.median(times[(layout, FEW)]) / 1e3
        many = statistics.median(times[(layout, args.keys)]) / 1e3
        print(f"{layout:>7}: {FEW:,} keys {few:.2f} µs, {args.keys:,} keys {many:.2f} µs, "
              f"growth {many - few:+.2f} µs ({many / few:.2f}x)")


if __name__ == "__main__":
    main()
