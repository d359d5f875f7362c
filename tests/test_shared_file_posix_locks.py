"""A process keeps its record locks on the shared files it locks for as long as it holds them.

The generation table (its slots' and header's locks) and the host-wide
counters file (its header's lock) are locked with POSIX record locks
(``shared_file.lock_range``). Those belong to the process, not to a
descriptor or a thread: closing ANY descriptor of a file drops every record
lock the process holds on it, and two threads of one process never exclude
each other. Pinned here: nothing of ours closes a descriptor of such a file
while another thread of the process may hold its lock, and the counters
file's readers do not take or release a lock another thread holds.

The locks are probed from another process: record locks of one process never
conflict with each other. (``test_sqlite_posix_locks.py`` pins the same for
SQLite's own locks on the shard files.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from djcachebench.hoststats.file import StatsFile, read_totals

PROBE = textwrap.dedent("""
    import fcntl, os, sys

    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, int(sys.argv[3]), int(sys.argv[2]), 0)
    except OSError:
        print(True)
    else:
        print(False)
""")


#: The counters file's header lock: its first eight words (``hoststats.file``).
STATS_LOCK = 64


def locked(path: str, start: int, length: int) -> bool:
    """Does some other process hold a record lock on ``[start, start+length)`` of ``path``?"""
    out = subprocess.run([sys.executable, "-c", PROBE, path, str(start), str(length)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.strip() == "True"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_reading_the_host_totals_leaves_a_flush_of_another_thread_its_lock(
    tmp_path: Path,
) -> None:
    """``host_stats()`` reads the counters file through a descriptor of its
    own while another thread's flush may be claiming or folding a slot under
    the header's lock. On the code before, the read took the same lock at
    once (a lock of its own process), released it and closed its descriptor:
    another process could then claim or fold in the middle of the flush."""
    path = str(tmp_path / "stats.mmap")
    f = StatsFile.open(path, ("hits", "misses"))
    holding, done = threading.Event(), threading.Event()
    held: list[bool] = []

    def flush() -> None:  # as Publisher.flush's claim holds it
        with f.locked() as got:
            held.append(got)
            holding.set()
            done.wait(60)

    thread = threading.Thread(target=flush)
    thread.start()
    try:
        assert holding.wait(60) and held == [True]
        assert locked(path, 0, STATS_LOCK)  # what is probed
        before = open_fds()

        assert read_totals(path) is not None

        assert locked(path, 0, STATS_LOCK)
    finally:
        done.set()
        thread.join(60)
    # The read's descriptor and mapping were closed once the flush let go.
    assert open_fds() <= before
    f.close()
    assert not locked(path, 0, STATS_LOCK)
