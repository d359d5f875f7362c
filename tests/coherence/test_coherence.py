"""The generation table on its own: tokens, chains, files, processes, faults."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from djcachebench.coherence import GenerationTable
from djcachebench.coherence import table as coherence
from djcachebench.coherence.tokens import tokens

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def table(tmp_path: Path) -> Iterator[GenerationTable]:
    t = GenerationTable(str(tmp_path / "generations.mmap"))
    yield t
    t.close()


def _same_slot_pair(table: GenerationTable) -> tuple[str, str]:
    """Two distinct keys that hash to one slot (a brute-force search; small tables only)."""
    seen: dict[int, str] = {}
    for i in range(100_000):
        key = f":1:k{i}"
        off = table.token(key)[0]
        if off in seen:
            return seen[off], key
        seen[off] = key
    raise AssertionError("no collision found")


def test_stamp_makes_only_that_key_stale(table: GenerationTable) -> None:
    a, b = table.token(":1:a"), table.token(":1:b")
    assert a[0] != b[0], "test keys must not share a slot"
    assert table.is_current(":1:a", a) and table.is_current(":1:b", b)
    table.stamp(":1:a")
    assert not table.is_current(":1:a", a)
    assert table.is_current(":1:b", b)
    fresh = table.token(":1:a")
    assert table.is_current(":1:a", fresh)


def test_stamp_many_and_stamp_all(table: GenerationTable) -> None:
    keys = [f":1:k{i}" for i in range(50)]
    before = {k: table.token(k) for k in keys}
    table.stamp_many(keys[:10])
    assert not any(table.is_current(k, before[k]) for k in keys[:10])
    survivors = [k for k in keys[10:] if table.is_current(k, before[k])]
    assert survivors, "stamping 10 keys must not invalidate all 50 (slots are many)"
    after = {k: table.token(k) for k in keys}
    table.stamp_all()
    assert not any(table.is_current(k, after[k]) for k in keys)


def test_tokens_never_repeat_in_a_process() -> None:
    drawn = [tokens.next() for _ in range(100_000)]
    assert len(set(drawn)) == len(drawn)
    assert 0 not in drawn


def test_consecutive_tokens_differ_in_both_halves() -> None:
    # Why: a torn read of an 8-byte slot must never reassemble an older token.
    drawn = [tokens.next() for _ in range(10_000)]
    pairs = list(itertools.pairwise(drawn))
    lo_same = sum((a & 0xFFFFFFFF) == (b & 0xFFFFFFFF) for a, b in pairs)
    hi_same = sum((a >> 32) == (b >> 32) for a, b in pairs)
    assert lo_same == 0 and hi_same == 0


def test_racing_writers_never_restore_a_readers_token(table: GenerationTable) -> None:
    # Tokens, not increments: whatever order two stamps land in, the slot never
    # holds what a reader took before them.
    held = table.token(":1:x")
    for _ in range(1000):
        table.stamp(":1:x")
        assert not table.is_current(":1:x", held)


def test_a_slot_holds_a_token_and_nothing_about_which_key(table: GenerationTable) -> None:
    """Nothing shared decides which key a value or an expiry belongs to: a stamp
    takes no expiry into the slot (readers learn it from their own read)."""
    off = table.locate(":1:e")
    table.stamp(":1:e", 1_700_000_000.9)
    raw = bytes(table.buffer[off:off + 16])
    stamp, mark = table.read_at(off)[2]
    # A stamp and a mark (0: this table is stamped by the adapter), nothing else.
    assert (stamp, mark) == (int.from_bytes(raw[:8], "little"), 0) and stamp != 0


def test_file_mode_and_header_slot_count_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "g.mmap")
    first = GenerationTable(path, slots=128)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    second = GenerationTable(path, slots=4096)
    assert second.slots == 128
    tok = second.token(":1:z")
    first.stamp(":1:z")
    assert not second.is_current(":1:z", tok)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["g.mmap"]  # no temp left
    first.close()
    second.close()


def test_refuses_a_file_that_is_not_shaped_like_a_table(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-table"
    bad.write_bytes(b"x" * 4097)
    with pytest.raises(ValueError, match="not a djcachebench generation table"):
        GenerationTable(str(bad))
    assert bad.read_bytes() == b"x" * 4097, "somebody's data is never overwritten"


def test_in_process_table_is_private_after_fork() -> None:
    table = GenerationTable.in_process(slots=64)
    tok = table.token(":1:p")
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=table.stamp, args=(":1:p",))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert table.is_current(":1:p", tok)  # the child's stamp stayed in the child
    table.stamp(":1:p")
    assert not table.is_current(":1:p", tok)


def _child_tokens(conn) -> None:  # runs in a forked child
    conn.send([tokens.next() for _ in range(100)])


def test_forked_child_draws_other_tokens() -> None:
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=_child_tokens, args=(child_end,))
    proc.start()
    mine = [tokens.next() for _ in range(100)]
    theirs = parent_end.recv()
    proc.join(30)
    assert not set(mine) & set(theirs)


def _open_and_stamp(path: str, barrier, key: str, out) -> None:
    barrier.wait(30)
    table = GenerationTable(path, slots=1024)
    table.stamp(key)
    out.put((os.getpid(), table.slots))
    table.close()


@pytest.mark.slow
def test_many_processes_create_one_table_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "race" / "g.mmap")
    n = 6
    barrier = SPAWN.Barrier(n)
    out = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_open_and_stamp, args=(path, barrier, f":1:w{i}", out))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert {slots for _, slots in results} == {1024}
    table = GenerationTable(path)
    # Every process stamped into the one shared file: no slot of theirs is 0.
    assert all(table.token(f":1:w{i}")[2][0] != 0 for i in range(n))
    assert sorted(os.listdir(os.path.dirname(path))) == ["g.mmap"]
    table.close()


def _stamp_in_child(path: str, key: str) -> None:
    table = GenerationTable(path)
    table.stamp(key)
    table.close()


@pytest.mark.slow
def test_stamp_in_another_process_is_seen(table: GenerationTable) -> None:
    tok = table.token(":1:shared")
    proc = SPAWN.Process(target=_stamp_in_child, args=(table.path, ":1:shared"))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert not table.is_current(":1:shared", tok)


# -- compare-and-stamp (write-through) ------------------------------------------


def test_chain_proves_no_other_stamp_came_between(table: GenerationTable) -> None:
    since = table.token(":1:c")
    GenerationTable.begin_chain()
    table.stamp(":1:c")  # e.g. the L2's own stamp
    table.stamp(":1:c", 99.0)  # and the adapter's
    links = GenerationTable.end_chain()
    kept = table.chained(links, since, max_stamps=2)
    assert kept is not None and table.is_current(":1:c", kept)
    assert table.chained(links, since, max_stamps=1) is None  # more stamps than expected


def _foreign_stamp(path: str, key: str) -> None:
    t = GenerationTable(path)
    t.stamp(key)
    t.close()


def test_chain_breaks_on_a_stamp_from_elsewhere(table: GenerationTable) -> None:
    since = table.token(":1:c")
    GenerationTable.begin_chain()
    table.stamp(":1:c")
    # Another process's stamp lands between this write's stamps.
    proc = SPAWN.Process(target=_foreign_stamp, args=(table.path, ":1:c"))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    table.stamp(":1:c")
    assert table.chained(GenerationTable.end_chain(), since, max_stamps=2) is None


def test_chain_needs_the_token_from_before_the_write(table: GenerationTable) -> None:
    since = table.token(":1:c")
    table.stamp(":1:c")  # someone else's write, before ours began recording
    GenerationTable.begin_chain()
    table.stamp(":1:c")
    assert table.chained(GenerationTable.end_chain(), since, max_stamps=2) is None


def test_stamps_outside_a_chain_are_not_recorded(table: GenerationTable) -> None:
    table.stamp(":1:c")
    assert GenerationTable.end_chain() == {}


def test_publish_only_under_the_current_token(tmp_path: Path) -> None:
    from djcachebench.coherence.board import NOT_PUBLISHED, ValueBoard, board_key, encode

    table = GenerationTable(str(tmp_path / "g"), slots=64)
    board = ValueBoard(str(tmp_path / "g.values"), 64, 32, key=board_key(b"test"))
    off = table.locate(":1:p")
    index = GenerationTable.slot_index(off)
    table.stamp(":1:p")
    token = table.token(":1:p")

    def put(value: bytes) -> bool:
        return board.write(index, token[2], token[1], 1e12, b":1:p", *encode(value))

    assert table.publish(token, lambda: put(b"new"))
    assert board.fetch(index, token[2], token[1], b":1:p") == (b"new", 1e12)
    table.stamp(":1:p")  # a later write: the published value is no longer current
    assert not table.publish(token, lambda: put(b"late"))
    assert board.fetch(index, token[2], token[1], b":1:p") == (b"new", 1e12)  # not rewritten
    fresh = table.token(":1:p")
    assert board.fetch(index, fresh[2], fresh[1], b":1:p")[0] is NOT_PUBLISHED
    table.close()
    board.close()


def test_watch_is_shared_through_the_file_and_never_undone(tmp_path: Path) -> None:
    path = str(tmp_path / "generations.mmap")
    writer, reader = GenerationTable(path), GenerationTable(path)
    assert not writer.watched(), "a new table has no reader yet"
    reader.watch()
    assert writer.watched(), "a reader's watch() must reach other mappings of the file"
    reader.watch()  # idempotent
    reader.close()
    assert GenerationTable(path).watched(), "the word lives as long as the file"


# -- faults: stopped lock holders, damaged files -------------------------------------


def _hold_slot_lock_then_stop(path: str, offset: int, ready) -> None:
    """A writer stopped inside a stamp: it holds the slot's record lock, then SIGSTOPs."""
    import fcntl
    import signal

    fd = os.open(path, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 8, offset, os.SEEK_SET)
    ready.set()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


@pytest.mark.slow
def test_a_stopped_lock_holder_never_blocks_a_stamp(table: GenerationTable) -> None:
    """Defect: a writer stopped by SIGSTOP inside a stamp blocked every other writer
    of that slot forever (a blocking lockf). Now a stamp waits at most STAMP_WAIT,
    bumps the epoch instead (so no older L1 entry stays servable) and counts it."""
    import signal
    import threading

    key = ":1:stopped"
    off = table.locate(key)
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=_hold_slot_lock_then_stop, args=(table.path, off, ready))
    holder.start()
    try:
        assert ready.wait(30)
        time.sleep(0.2)  # let it stop
        before = table.token(key)
        done = threading.Event()
        worker = threading.Thread(target=lambda: (table.stamp(key), done.set()), daemon=True)
        started = time.monotonic()
        worker.start()
        assert done.wait(5), "stamp() blocked behind a stopped lock holder"
        assert time.monotonic() - started < coherence.STAMP_WAIT + 1.0
        assert not table.is_current(key, before), "the give-up must still invalidate"
        assert table.stats.lock_give_ups == 1
        other = table.token(":1:another-key")
        assert table.is_current(":1:another-key", other)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)


def test_truncated_table_is_repaired_before_it_is_touched(tmp_path: Path) -> None:
    """Defect: a truncated generations.mmap killed running processes with SIGBUS.
    A process's next stamp or fill checks the size first, re-extends the file and
    bumps the epoch (counted, logged); nothing read under the old file stays
    servable."""
    path = tmp_path / "generations.mmap"
    table = GenerationTable(str(path), slots=1024)
    held = table.token(":1:a")
    size = path.stat().st_size
    os.truncate(path, 0)
    table.stamp(":1:a")  # would touch an unbacked page without the check
    assert path.stat().st_size == size
    assert table.stats.repairs == 1
    assert not table.is_current(":1:a", held)
    fresh = table.token(":1:a")
    table.stamp(":1:b")
    assert table.is_current(":1:a", fresh) or table.locate(":1:a") == table.locate(":1:b")
    table.close()


def test_an_overwritten_header_is_rebuilt_for_new_processes(tmp_path: Path) -> None:
    """Defect: an overwritten header made every new process fail, with no recovery."""
    path = tmp_path / "generations.mmap"
    GenerationTable(str(path), slots=512).close()
    with open(path, "r+b") as f:
        f.write(b"\xff" * 64)
    table = GenerationTable(str(path), slots=4096)
    assert table.slots == 512, "the slot count comes from the file's size"
    assert table.stats.repairs == 1
    assert table.watched(), "nobody can tell who relied on the old header"
    table.close()
    again = GenerationTable(str(path))
    assert again.stats.repairs == 0 and again.slots == 512
    again.close()


def test_table_blocks_are_allocated_not_sparse(tmp_path: Path) -> None:
    """Defect: the table was a sparse file, so its first stamp after the disk filled
    touched an unbacked page (SIGBUS). Its blocks now exist before it is mapped."""
    path = tmp_path / "generations.mmap"
    GenerationTable(str(path), slots=1 << 16).close()
    st = path.stat()
    assert st.st_blocks * 512 >= st.st_size


def test_one_descriptor_per_path_per_process(tmp_path: Path) -> None:
    """Defect: every backend instance opened (and leaked) its own descriptor."""
    from djcachebench.coherence import open_table

    path = str(tmp_path / "generations.mmap")
    first = open_table(path)
    opened = _descriptors_of(path)  # ours, and the one the mmap module keeps
    tables = [open_table(path) for _ in range(50)]
    assert all(t is first for t in tables)
    assert _descriptors_of(path) == opened <= 2


def _descriptors_of(path: str) -> int:
    real = os.path.realpath(path)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{name}") == real
    return count


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a file to another user")
    path = tmp_path / "generations.mmap"
    GenerationTable(str(path)).close()
    os.chown(path, 65534, 65534)
    with pytest.raises(OSError, match="belongs to uid 65534"):
        GenerationTable(str(path))
