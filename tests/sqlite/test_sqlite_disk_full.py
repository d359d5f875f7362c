"""A full disk: writes fail softly, nothing committed is lost, every shard stays sound.

The disk is "filled" for one child process with ``RLIMIT_FSIZE`` (see
``sqlite_workers.disk_full_writer``): the real SQLite files then cannot grow,
which is what a full disk does to SQLite, without mounting a small file
system (the test must run as any user, in CI too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import SPAWN, integrity_check, join_all, shard_files, start
from .workers import disk_full_writer

BIG = 200_000  # each value needs ~50 new WAL pages: far more than the room left


def test_a_full_disk_fails_writes_softly_and_loses_nothing_committed(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache({"MAX_ENTRIES": None})
    kept = {f"k{i}": f"value {i}" for i in range(200)}
    cache.set_many(kept)
    cache.close_connections()

    receive, send = SPAWN.Pipe(duplex=False)
    child = start(disk_full_writer, str(cache_dir), {"MAX_ENTRIES": None}, kept, BIG, send)
    assert receive.poll(120), "the child reported nothing"
    outcome = receive.recv()
    assert join_all([child]) == [0]

    assert outcome["raised"] == [], "a full disk must not crash a request"
    assert outcome["errors"] > 0, "failed writes must be counted"
    assert outcome["kept"] == len(kept), "reads must go on serving committed values"
    assert outcome["big_torn"] == 0, "a value is stored whole or not at all"

    again = make_cache({"MAX_ENTRIES": None})
    assert again.get_many(list(kept)) == kept
    for path in shard_files(cache_dir):
        assert integrity_check(path) == "ok", path
    again.set("after", "x" * BIG)  # room again: writes work again
    assert again.get("after") == "x" * BIG
