"""MAX_ENTRIES with many writer processes: the documented bound holds across them.

One process culls at a time (eviction.py); a writer that finds a cull under way
goes on without culling, until the count is over the limit by more than one
cull's worth: then it waits for the cull. Each writer checks *after* its insert,
so when the count crosses that margin every writer may already have made one
insert past it: the bound documented in docs/settings.md (``MAX_ENTRIES``) and
docs/architecture.md ("Counting and culling across shards") is
``MAX_ENTRIES + MAX_ENTRIES // CULL_FREQUENCY + writers``, while culls finish
within ``LOCK_TIMEOUT``, also when a cull is larger than one call removes
(``CULL_BATCH``) and the rest is debt paid by the inserts that follow. Once
the writers stop, the shards' own counts are exact and the next insert culls
back under the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.eviction import CULL_BATCH

from .helpers import PATIENT, SPAWN, join_all, raw_shard, shard_files, start
from .workers import filling_writer

# (MAX_ENTRIES, writer processes, new keys per writer): a cull of 100 entries,
# removed by one call; and, with eight writers, culls of 400 entries, more
# than one call removes (CULL_BATCH), so most of each is debt paid by later
# inserts while the eight go on inserting.
CASES = [(300, 6, 400), (1200, 8, 500)]


def rows_on_disk(location: Path) -> int:
    total = 0
    for path in shard_files(location):
        with raw_shard(path) as conn:
            total += conn.execute("SELECT count(*) FROM cache").fetchone()[0]
    return total


@pytest.mark.slow
@pytest.mark.parametrize(("limit", "procs", "each"), CASES)
def test_max_entries_holds_across_writer_processes(
    make_cache: Callable[..., ShardedSQLiteCache],
    cache_dir: Path,
    limit: int,
    procs: int,
    each: int,
) -> None:
    assert max(c[0] // 3 for c in CASES) > CULL_BATCH  # premise: one case culls with debt
    options = {**PATIENT, "MAX_ENTRIES": limit, "CULL_FREQUENCY": 3}
    cache = make_cache(options)
    barrier = SPAWN.Barrier(procs)
    pipes = [SPAWN.Pipe(duplex=False) for _ in range(procs)]
    started, done = SPAWN.Value("q", 0), SPAWN.Value("q", 0)
    workers = [
        start(filling_writer, str(cache_dir), options, f"p{n}", each, barrier, send,
              started, done)
        for n, (_, send) in enumerate(pipes)
    ]
    largest = [receive.recv() if receive.poll(120) else None for receive, _ in pipes]
    assert join_all(workers) == [0] * procs
    assert None not in largest, "a writer reported nothing"

    # While racing: over the limit by at most one cull's worth (limit // 3), after
    # which writers wait for the cull under way, plus one insert per writer made
    # before its check (the documented bound; each writer samples the exact
    # count after every insert).
    bound = limit + limit // 3 + procs
    # Each sample is corrected for the inserts made while it was taken (see
    # filling_writer): it never exceeds a true count.
    assert max(largest) <= bound, largest
    on_disk = rows_on_disk(cache_dir)
    assert cache.entry_count() == on_disk, "the shards' counts must be exact"
    assert on_disk <= bound
    cache.set("one-more", 1)  # quiescent: this insert culls back under the limit
    assert cache.entry_count() <= limit
    assert cache.get("one-more") == 1
