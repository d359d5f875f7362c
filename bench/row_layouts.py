"""Where should a value of 1-32 KB live in a shard? The SELECT of each row layout.

Raw SQLite, no cache code: the same rows in three layouts of one table, read by
key in a random order, the layouts interleaved call by call (a noisy neighbour
slows all three alike):

* ``without-rowid``  the value in the ``WITHOUT ROWID`` table keyed by the key
                     (format 4's ``cache``)
* ``rowid``          a rowid table with a unique index on the key (diskcache's)
* ``blobs``          format 5: the key's row in the ``WITHOUT ROWID`` table names
                     a row of a rowid ``blobs`` table, read by a subquery;
                     values shorter than ``--inline`` stay in the key's row

Why it matters: SQLite reads the whole of a ``WITHOUT ROWID`` row that spills
onto overflow pages each time a lookup compares its key, so a long value makes
every lookup that passes it slower (docs/architecture.md, "Values in blobs").

    .venv/bin/python bench/row_layouts.py [--sizes 300,1000,2000,10000,30000]
        [--keys 10000] [--reads 20000] [--inline 900]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time

COLUMNS = "expires REAL, stored INTEGER NOT NULL, created INTEGER NOT NULL, kind INTEGER NOT NULL"
LAYOUTS = {
    "without-rowid": (
        f"CREATE TABLE cache (key TEXT PRIMARY KEY NOT NULL, {COLUMNS}, value, "
        "size INTEGER NOT NULL, file TEXT) WITHOUT ROWID",
        "SELECT kind, value, expires, file, size FROM cache WHERE key = ?",
    ),
    "rowid": (
        f"CREATE TABLE cache (key TEXT NOT NULL, {COLUMNS}, size INTEGER NOT NULL, "
        "file TEXT, value); CREATE UNIQUE INDEX cache_key ON cache (key)",
        "SELECT kind, value, expires, file, size FROM cache WHERE key = ?",
    ),
    "blobs": (
        f"CREATE TABLE cache (key TEXT PRIMARY KEY NOT NULL, {COLUMNS}, value, "
        "size INTEGER NOT NULL, file TEXT, blob INTEGER) WITHOUT ROWID; "
        "CREATE TABLE blobs (id INTEGER PRIMARY KEY, value BLOB NOT NULL)",
        "SELECT kind, coalesce(value, (SELECT b.value FROM blobs AS b WHERE b.id = cache.blob)), "
        "expires, file, size FROM cache WHERE key = ?",
    ),
}
INSERT = (
    "INSERT INTO cache (key, expires, stored, created, kind, value, size) "
    "VALUES (?, NULL, 1, 1, 3, ?, ?)"
)


def fill(conn: sqlite3.Connection, layout: str, keys: int, value: bytes, inline: int) -> None:
    conn.execute("BEGIN")
    for i in range(keys):
        key = f"key{i}"
        if layout == "blobs" and len(value) + len(key) > inline:
            blob = conn.execute("INSERT INTO blobs (value) VALUES (?)", (value,)).lastrowid
            conn.execute(
                "INSERT INTO cache (key, expires, stored, created, kind, value, size, blob) "
                "VALUES (?,NULL,1,1,3,NULL,?,?)", (key, len(value), blob))
        else:
            conn.execute(INSERT, (key, value, len(value)))
    conn.execute("COMMIT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="300,1000,2000,10000,30000")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--inline", type=int, default=900)
    args = parser.parse_args()
    print(f"keys={args.keys} reads={args.reads} sqlite={sqlite3.sqlite_version}; "
          "SELECT p50 in µs")
    print(f"{'size':>7} " + " ".join(f"{name:>14}" for name in LAYOUTS))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as workdir:
        for size in (int(x) for x in args.sizes.split(",")):
            value = os.urandom(size)
            conns = {}
            for name, (ddl, _) in LAYOUTS.items():
                path = os.path.join(workdir, f"{name}-{size}.sqlite3")
                conn = sqlite3.connect(path, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(ddl)
                fill(conn, name, args.keys, value, args.inline)
                conns[name] = conn
            order = [f"key{i}" for i in range(args.keys)]
            rng = random.Random(size)
            samples: dict[str, list[int]] = {name: [] for name in LAYOUTS}
            clock = time.perf_counter_ns
            for n in range(args.reads):
                key = order[rng.randrange(args.keys)] if n else order[0]
                for name, (_, select) in LAYOUTS.items():
                    conn = conns[name]
                    start = clock()
                    row = conn.execute(select, (key,)).fetchone()
                    samples[name].append(clock() - start)
                    assert row[1] == value
            print(f"{size:>7} " + " ".join(
                f"{statistics.median(samples[name]) / 1000:>14.1f}" for name in LAYOUTS))
            for conn in conns.values():
                conn.close()
            for name in LAYOUTS:
                for suffix in ("", "-wal", "-shm"):
                    path = os.path.join(workdir, f"{name}-{size}.sqlite3{suffix}")
                    if os.path.exists(path):
                        os.unlink(path)


if __name__ == "__main__":
    main()
