"""A process keeps its SQLite locks on the shard files for as long as it uses them.

Closing any descriptor of a file drops every POSIX lock the closing process
holds on it, SQLite's included. A process that lost them goes on writing
through its open connections while another process, closing its last
connection, finds the file unlocked, takes it for unused, checkpoints it and
deletes its log: the first process's later commits go to a log nobody reads.
Seen as two ``add`` calls of one key that both won (a stampede lease taken
twice) and "disk I/O error" when 16 processes of 4 threads each started on one
cache: every thread's new cache instance read the shard headers through
descriptors of its own. Pinned: nothing of ours closes a descriptor of a shard
file or of its ``-shm`` while the process may have a connection open on it.

The locks are probed from another process: POSIX locks of one process never
conflict with each other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from .helpers import new_cache

# SQLite's unix locking: every connection of a database in WAL mode holds a
# read lock on the SHARED range of the file (from PENDING_BYTE + 2, 510
# bytes) and on the DMS byte of its -shm (byte 128) while it is open.
PROBE = textwrap.dedent("""
    import fcntl, os, sys

    def locked(path, start, length):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start, 0)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    print(locked(sys.argv[1], 0x40000002, 510), locked(sys.argv[1] + "-shm", 128, 1))
""")


def locks_held(path: str) -> tuple[bool, bool]:
    """Does some other process hold SQLite's read locks on the shard at ``path``
    and on its ``-shm``?"""
    out = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return out[0] == "True", out[1] == "True"


def test_a_new_cache_instance_keeps_the_locks_of_the_open_connections(tmp_path: Path) -> None:
    """Django makes a cache instance per thread: the instance a new thread makes
    must leave the connections of the others their locks (it dropped them on
    the code before: its check of the layout read every shard's header)."""
    location = tmp_path / "cache"
    cache = new_cache(location, {"SHARDS": 2})
    for i in range(20):
        cache.set(f"key-{i}", i)  # a connection to each shard, with a log
    paths = [shard.path for shard in cache._store.shards]
    assert [locks_held(p) for p in paths] == [(True, True)] * 2  # what is probed

    new_cache(location, {"SHARDS": 2})

    assert [locks_held(p) for p in paths] == [(True, True)] * 2
    assert all(cache.get(f"key-{i}") == i for i in range(20))


def test_giving_a_cut_file_its_bytes_back_keeps_the_locks_of_the_open_connections(
    tmp_path: Path,
) -> None:
    """A thread that finds its shard cut short gives the file and its ``-shm``
    their bytes back (``Shard.regrow``) before it reopens; the other threads'
    connections to the shard keep theirs open, and must keep their locks
    (dropped on the code before, which closed the descriptors it grew them
    through). Called with the sizes as they are: the descriptors alone are
    what is pinned here, without cutting a file mapped by this process."""
    cache = new_cache(tmp_path / "cache", {"SHARDS": 1})
    cache.set("key", "value")
    shard = cache._store.shards[0]
    sizes = (os.path.getsize(shard.path), os.path.getsize(shard.path + "-shm"))
    assert locks_held(shard.path) == (True, True)

    shard.regrow(sizes, shard.file_id())

    assert locks_held(shard.path) == (True, True)
    assert cache.get("key") == "value"
