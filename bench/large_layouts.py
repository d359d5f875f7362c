"""Where should a large value live? Read and write cost of the candidate layouts.

Measures, for values of 10 KB to 10 MB, the read (p50 of repeated reads of
a warm row) and the write (replace) of:

* ``wr-inline``  the value in a ``WITHOUT ROWID`` table keyed by the cache key
* ``rowid``      the value in a rowid table, fetched with a SELECT
* ``blob-read``  the value in a rowid table, read with ``Connection.blobopen``
                 (one copy from SQLite's pages into the result)
* ``*-mmap``     the same with ``PRAGMA mmap_size``
* ``file``       the value in a file beside the database (``os.read``)

and the cost of hashing it (BLAKE2b, SHA-256) and of slicing a tag off it.

    .venv/bin/python bench/large_layouts.py [--sizes 10000,100000,1000000,10000000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable


def p50(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def connect(path: str, mmap: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    if mmap:
        conn.execute(f"PRAGMA mmap_size={mmap}")
    conn.execute("CREATE TABLE IF NOT EXISTS wr (key TEXT PRIMARY KEY, value) WITHOUT ROWID")
    conn.execute("CREATE TABLE IF NOT EXISTS r (id INTEGER PRIMARY KEY, value)")
    return conn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000,10000000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "db.sqlite3")
        plain = connect(path, 0)
        mapped = connect(path, 1 << 30)
        print(f"{'size':>10} {'layout':>14} {'read p50':>12} {'write p50':>12}")
        for size in (int(s) for s in args.sizes.split(",")):
            one_size(tmp, plain, mapped, size)


def one_size(tmp: str, plain: sqlite3.Connection, mapped: sqlite3.Connection,
             size: int) -> None:
    value = os.urandom(size)
    n = max(5, min(200, 20_000_000 // size))
    fpath = os.path.join(tmp, "value")
    for conn, suffix in ((plain, ""), (mapped, "-mmap")):
        conn.execute("INSERT OR REPLACE INTO wr VALUES ('k', ?)", (value,))
        conn.execute("INSERT OR REPLACE INTO r VALUES (1, ?)", (value,))
        rows = {
            "wr-inline": (lambda c=conn: c.execute(
                "SELECT value FROM wr WHERE key = 'k'").fetchone(),
                lambda c=conn: c.execute(
                "INSERT OR REPLACE INTO wr VALUES ('k', ?)", (value,))),
            "rowid": (lambda c=conn: c.execute(
                "SELECT value FROM r WHERE id = 1").fetchone(),
                lambda c=conn: c.execute(
                "INSERT OR REPLACE INTO r VALUES (1, ?)", (value,))),
            "blob-read": (lambda c=conn: _blob(c), None),
        }
        for name, (read, write) in rows.items():
            r = p50(read, n) * 1e6
            w = p50(write, max(3, n // 4)) * 1e6 if write else float("nan")
            print(f"{size:>10} {name + suffix:>14} {r:>10.1f}µs {w:>10.1f}µs")

    def write_file() -> None:
        fd = os.open(fpath + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, value)
        os.close(fd)
        os.rename(fpath + ".tmp", fpath)

    def read_file() -> bytes:
        fd = os.open(fpath, os.O_RDONLY)
        try:
            return os.read(fd, size + 1)
        finally:
            os.close(fd)

    write_file()
    print(f"{size:>10} {'file':>14} {p50(read_file, n) * 1e6:>10.1f}µs "
          f"{p50(write_file, max(3, n // 4)) * 1e6:>10.1f}µs")
    for algo in ("blake2b", "sha256"):
        t = p50(lambda a=algo: hashlib.new(a, value).digest(), n) * 1e6
        print(f"{size:>10} {algo:>14} {t:>10.1f}µs")
    print(f"{size:>10} {'slice':>14} {p50(lambda: value[16:], n) * 1e6:>10.1f}µs")


def _blob(conn: sqlite3.Connection) -> bytes:
    with conn.blobopen("r", "value", 1, readonly=True) as blob:
        return blob.read()


if __name__ == "__main__":
    main()
