"""The generation table file replaced under processes that have not looked yet.

A process checks the table file at most every ``CHECK_EVERY`` (one ``lseek``
and one ``stat``: cheaper than one per call). Inside that window another
process may find the file deleted and make a new one. With the file deleted
over and over under a plain ShardedSQLiteCache writer and a TieredCache reader,
a stale read can come two ways, each pinned here with a real second process
whose check window is stretched so that the race is certain: a writer that
stamps (or, unwatched, skips) the deleted file, and a reader that fills under
it.

A reader confirms the file after its L2 read (one ``stat``). A writer does not
(that was a ``stat`` per write): a process keeps nothing under a file it
mapped until ``SETTLE_AFTER_MAPPING`` (at least ``CHECK_EVERY``) has passed,
and a writer whose check still stands saw its file at the path less than
``CHECK_EVERY`` before, so it wrote before the new file existed plus that
window. The writer tests stretch both windows alike in both processes, as the
constants are one in a real deployment.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.coherence.table import CHECK_EVERY
from tests.tiered.helpers import sqlite_tiered

SPAWN = multiprocessing.get_context("spawn")
#: The other process's check window: longer than the test.
LONG_WINDOW = 600.0


def _serve(conn: Connection, kind: str, location: str, window: float = LONG_WINDOW) -> None:
    """A cache in another process whose table checks stand for ``window`` (and
    which keeps nothing for ``window`` after mapping a table file): runs
    ``(method, args)`` sent over ``conn`` and sends back the result."""
    from djcachebench.coherence import table_file

    table_file.CHECK_EVERY = window  # type: ignore[misc]
    table_file.SETTLE_AFTER_MAPPING = window  # type: ignore[misc]
    if kind == "plain":
        cache: Any = ShardedSQLiteCache(location, {"OPTIONS": {}})
    else:
        cache = sqlite_tiered(Path(location).parent)
    while True:
        command = conn.recv()
        if command is None:
            return
        method, args = command
        conn.send(getattr(cache, method)(*args))


class Other:
    """The other process, driven call by call."""

    def __init__(self, kind: str, location: str, window: float = LONG_WINDOW) -> None:
        self.conn, theirs = SPAWN.Pipe()
        self.process = SPAWN.Process(target=_serve, args=(theirs, kind, location, window))
        self.process.start()

    def __call__(self, method: str, *args: Any) -> Any:
        self.conn.send((method, args))
        if not self.conn.poll(60):
            raise AssertionError(f"the other process did not answer {method}{args}")
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send(None)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


@pytest.fixture
def location(tmp_path: Path) -> str:
    return str(tmp_path / "sqlite")


def _delete_table(location: str) -> None:
    os.unlink(os.path.join(location, "generations.mmap"))
    time.sleep(2 * CHECK_EVERY)  # this process's next check is due


#: Both processes' windows in the writer tests: long enough that the steps of
#: the race fit in it on a loaded machine, short enough to wait out once.
SHARED_WINDOW = 3.0


@pytest.fixture
def stretched(monkeypatch: pytest.MonkeyPatch) -> float:
    """This process's windows stretched as the other process's are."""
    from djcachebench.coherence import table_file

    monkeypatch.setattr(table_file, "CHECK_EVERY", SHARED_WINDOW)
    monkeypatch.setattr(table_file, "SETTLE_AFTER_MAPPING", SHARED_WINDOW)
    return SHARED_WINDOW


def _replace_table_under_a_standing_writer_check(location: str, writer: Other,
                                                 reader: Any, how: str = "deleted") -> None:
    """The writer looks at its table file (its check then stands for the window),
    the file is deleted (or moved away: still linked, under another name), and
    the reader moves to a new one at once."""
    writer("set", "other", 1)
    path = os.path.join(location, "generations.mmap")
    if how == "deleted":
        os.unlink(path)
    else:
        os.rename(path, path + ".moved")
    assert not reader.generation_table.confirm()  # moved to a new file


@pytest.mark.parametrize("how", ["deleted", "moved away"])
@pytest.mark.parametrize("watched_before", [True, False])
def test_a_writer_that_stamped_a_deleted_table_file_ends_what_readers_of_the_new_one_keep(
        tmp_path: Path, location: str, watched_before: bool, stretched: float,
        how: str) -> None:
    """The writer's check still stood when it stamped the deleted file: the reader,
    which had moved to a new file and filled the key there, served the replaced
    value for good (the writer wrote nothing more, so it never looked again).
    ``watched_before=False``: no reader had watched the deleted file, so the
    writer skipped its stamp altogether. Now the reader keeps nothing under the
    new file until the writer's standing check has run out."""
    writer = Other("plain", location, stretched)
    try:
        writer("set", "k", "v1")
        reader = sqlite_tiered(tmp_path)
        if watched_before:
            assert reader.get("k") == "v1"
        time.sleep(stretched)  # what the reader mapped first has settled
        _replace_table_under_a_standing_writer_check(location, writer, reader, how)
        assert reader.get("k") == "v1"
        assert reader.get("k") == "v1"
        writer("set", "k", "v2")  # acknowledged; its check of the old file stands
        assert reader.get("k") == "v2"
        writer("delete", "k")
        assert reader.get("k") is None
    finally:
        writer.stop()


def test_a_value_written_through_just_after_a_move_is_not_kept_past_a_standing_writer(
        tmp_path: Path, location: str, stretched: float) -> None:
    """A TieredCache moves to a new table file on its hot path and writes ``k`` at
    once: its own copy (and the board's) was kept under the new file while a
    plain writer whose check of the old file still stood wrote ``k`` again
    without stamping the new file, and served after that acknowledged write,
    for good while that writer wrote nothing more. Both processes' checks run
    on the same window, half a window apart, as in a deployment."""
    writer = Other("plain", location, stretched)
    try:
        writer("set", "k", "v0")
        writer("set", "j", "j0")
        tiered = sqlite_tiered(tmp_path)
        assert tiered.get("k") == "v0"  # the table is watched
        time.sleep(stretched + 0.2)  # what it mapped has settled
        assert tiered.get("k") == "v0" and tiered.get("j") == "j0"
        checked = time.monotonic()  # its check stands from about now
        time.sleep(stretched / 2)
        writer("set", "other", 1)  # the writer's check stands from now
        os.unlink(os.path.join(location, "generations.mmap"))
        time.sleep(max(0.0, checked + stretched + 0.1 - time.monotonic()))
        assert tiered.get("j") == "j0"  # its check is due: it moves to a new file
        tiered.set("k", "v1")
        writer("set", "k", "v2")  # acknowledged; its check of the old file stands
        assert tiered.get("k") == "v2"
        assert tiered.get_many(["k"]) == {"k": "v2"}
    finally:
        writer.stop()


@pytest.mark.parametrize("read", ["get", "get_many"])
def test_a_reader_that_filled_under_a_deleted_table_file_serves_no_replaced_value(
        location: str, read: str) -> None:
    """The reader's check still stood when it took its token from the deleted file
    and filled: the writer, already on the new file, stamped only that one, and
    the reader served the value the write had replaced."""
    reader = Other("tiered", location)
    try:
        assert reader("get", "warm") is None  # the reader watches the table now
        writer = ShardedSQLiteCache(location, {"OPTIONS": {}})
        writer.set("k", "v1")
        _delete_table(location)
        writer.set("other", 1)  # the writer moves to a new file
        if read == "get":
            assert reader("get", "k") == "v1"
            writer.set("k", "v2")
            assert reader("get", "k") == "v2"
        else:
            assert reader("get_many", ["k", "j"]) == {"k": "v1"}
            writer.set("k", "v2")
            writer.set("j", "w")
            assert reader("get_many", ["k", "j"]) == {"k": "v2", "j": "w"}
    finally:
        reader.stop()


def test_clear_after_the_table_file_was_replaced_ends_what_readers_of_the_new_one_keep(
        tmp_path: Path, location: str, stretched: float) -> None:
    """``clear()`` bumps the epoch: of the deleted file only, when the writer's
    check of it still stands."""
    writer = Other("plain", location, stretched)
    try:
        writer("set", "k", "v1")
        reader = sqlite_tiered(tmp_path)
        assert reader.get("k") == "v1"
        time.sleep(stretched)
        _replace_table_under_a_standing_writer_check(location, writer, reader)
        assert reader.get("k") == "v1"
        writer("clear")
        assert reader.get("k") is None
    finally:
        writer.stop()


def test_a_reader_racing_another_threads_move_to_a_new_file_keeps_nothing_under_the_old(
        tmp_path: Path, location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A takes its token after thread B's move to a new table file bumped
    the old mapping's epoch, but before B swapped the mapping; A's confirmation
    passes (the path names the new file), yet A's value must not be kept under
    the old mapping, which nobody stamps any more, or ``get_many`` and
    ``has_key`` serve it until L1_TIMEOUT. Waits are injected only to make the
    interleaving certain (it happens on its own under load)."""
    import djcachebench.tiered.fill as fill_module  # where a miss takes its token
    from djcachebench.coherence import table_mapping

    tiered = sqlite_tiered(tmp_path)
    writer = ShardedSQLiteCache(location, {"OPTIONS": {}})  # this process: same table
    table = tiered.generation_table
    writer.set("k", "v1")
    a_checked, b_bumped, a_reading, b_done = (threading.Event() for _ in range(4))
    armed = {"A": True, "B": True}

    def first_time(name: str) -> bool:
        if threading.current_thread().name == name and armed[name]:
            armed[name] = False
            return True
        return False

    locate = fill_module.locate_for_l1

    def locate_then_yield(*args: Any, **kwargs: Any) -> Any:
        got = locate(*args, **kwargs)
        if first_time("A"):
            a_checked.set()
            b_bumped.wait(10)  # A is preempted after its check; B starts its move
        return got

    open_shared = table_mapping.open_shared_file

    def open_after_the_bump(*args: Any, **kwargs: Any) -> Any:
        if first_time("B"):
            b_bumped.set()  # _switch has bumped the old mapping's epoch
            a_reading.wait(10)  # A takes its token meanwhile
        return open_shared(*args, **kwargs)

    read = tiered._read_with_expiry

    def slow_read(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "A":
            a_reading.set()
            b_done.wait(10)  # the L2 read takes a moment; B finishes its move
        return read(*args, **kwargs)

    monkeypatch.setattr(fill_module, "locate_for_l1", locate_then_yield)
    monkeypatch.setattr(table_mapping, "open_shared_file", open_after_the_bump)
    monkeypatch.setattr(tiered, "_read_with_expiry", slow_read)

    def thread_b() -> None:
        a_checked.wait(10)
        os.unlink(os.path.join(location, "generations.mmap"))
        table.confirm()  # any call of this thread that finds the file replaced
        b_done.set()

    threads = [threading.Thread(target=lambda: tiered.get("k"), name="A"),
               threading.Thread(target=thread_b, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not armed["A"] and not armed["B"]  # the interleaving happened
    writer.set("k", "v2")  # acknowledged
    assert tiered.get_many(["k"]) == {"k": "v2"}
    writer.delete("k")
    assert not tiered.has_key("k")
