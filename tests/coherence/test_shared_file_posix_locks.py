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
import time
from pathlib import Path

from djcachebench.coherence.layout import SLOT, file_problem
from djcachebench.coherence.shared_file import lock_range, unlock_range
from djcachebench.coherence.table import open_table
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


def test_the_system_check_of_a_table_file_leaves_the_stamps_their_locks(
    tmp_path: Path,
) -> None:
    """``manage.py check`` (and any ``run_checks()`` in a serving process)
    looks at the table file's header. On the code before it opened the file
    and closed it again, dropping the slot lock a stamp of another thread
    held: another process could stamp the slot at the same time."""
    path = str(tmp_path / "generations.mmap")
    table = open_table(path, 64)
    off = table.locate("key")
    assert table._lock(off)  # what a stamp of another thread holds
    try:
        assert locked(path, off, SLOT)

        assert file_problem(path) is None
        assert file_problem(path) is None  # looked at again: the same descriptor

        assert locked(path, off, SLOT)
    finally:
        table._unlock(off)
    assert not locked(path, off, SLOT)


def test_a_second_thread_moving_to_a_replaced_table_file_leaves_the_stamps_their_locks(
    tmp_path: Path,
) -> None:
    """Two threads whose checks both saw the table file deleted move to the
    new one. The second moves after the first (what is called here, in one
    thread): on the code before it opened the new file again and closed the
    first's descriptor of it as the old one, between its switch and that
    close a stamp of a third thread took its slot's lock through the new
    descriptor (taken here without the thread lock, which the stamp would
    hold while the close, outside it, runs)."""
    path = str(tmp_path / "generations.mmap")
    table = open_table(path, 64)
    os.unlink(path)
    table.confirm()  # the first thread: moves to a new file at the path
    assert table._same_file()
    off = table.locate("key")
    fd = table._fd
    assert lock_range(fd, SLOT, off, time.monotonic() + 5)
    try:
        assert locked(path, off, SLOT)

        assert table._switch()  # the second thread, which saw the old file gone too

        assert locked(path, off, SLOT)
    finally:
        unlock_range(fd, SLOT, off)
    assert table.confirm()


CREATE = textwrap.dedent("""
    import fcntl, os, sys
    from djcachebench.coherence.shared_file import open_shared_file

    held = []

    def hook(event, args):
        # Another thread of this process opens and locks the new file before
        # the creating call is done with it (here: as it is being linked).
        if event == "os.link" and not held:
            fd = os.open(args[0], os.O_RDWR)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 0, 0)
            held.append(fd)

    sys.addaudithook(hook)
    fd = open_shared_file(sys.argv[1], 4096, b"header")
    print(len(held), flush=True)
    sys.stdin.readline()
""")


def test_creating_a_shared_file_leaves_the_locks_taken_on_it_meanwhile(tmp_path: Path) -> None:
    """The process that makes a shared file links it into place from a
    temporary name: on the code before it then closed that descriptor (of the
    file now at the path) and opened the path again, dropping whatever lock
    another of its threads had taken on the new file in between."""
    path = str(tmp_path / "shared.mmap")
    with subprocess.Popen([sys.executable, "-c", CREATE, path], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdin is not None
        try:
            assert child.stdout.readline().strip() == "1"  # the lock was taken
            assert locked(path, 0, 8)
        finally:
            child.stdin.write("\n")
            child.stdin.close()
            child.wait(60)
    assert child.returncode == 0
