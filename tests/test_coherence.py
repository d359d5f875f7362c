"""The generation table on its own: tokens, expiry publishing, files, processes."""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from djcachebench import coherence
from djcachebench.coherence import KEEP, GenerationTable

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def table(tmp_path: Path) -> Iterator[GenerationTable]:
    t = GenerationTable(str(tmp_path / "generations.mmap"))
    yield t
    t.close()


def _same_slot_pair(table: GenerationTable) -> tuple[str, str]:
    """Two distinct keys that hash to one slot (found by search; small tables only)."""
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
    drawn = [coherence._tokens.next() for _ in range(100_000)]
    assert len(set(drawn)) == len(drawn)
    assert 0 not in drawn


def test_consecutive_tokens_differ_in_both_halves() -> None:
    # Why: a torn read of an 8-byte slot must never reassemble an older token.
    drawn = [coherence._tokens.next() for _ in range(10_000)]
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


def test_published_expiry(table: GenerationTable) -> None:
    assert table.read(":1:e")[1] is None  # never stamped
    table.stamp(":1:e", 1_700_000_000.9)
    assert table.read(":1:e")[1] == 1_700_000_000.0  # rounded down, never later
    table.stamp(":1:e", math.inf)
    assert table.read(":1:e")[1] == math.inf
    table.stamp(":1:e", KEEP)  # incr: expiry unchanged
    assert table.read(":1:e")[1] == math.inf
    table.stamp(":1:e")  # delete: unknown
    assert table.read(":1:e")[1] is None
    table.stamp(":1:e", KEEP)
    assert table.read(":1:e")[1] is None
    table.stamp(":1:e", -5.0)  # already expired is known, and in the past
    exp = table.read(":1:e")[1]
    assert exp is not None and exp < 10


def test_expiry_of_another_key_in_the_slot_is_unknown(tmp_path: Path) -> None:
    table = GenerationTable(str(tmp_path / "small.mmap"), slots=8)
    a, b = _same_slot_pair(table)
    table.stamp(a, 2_000_000_000.0)
    assert table.read(a)[1] == 2_000_000_000.0
    assert table.read(b)[1] is None
    table.stamp(b, KEEP)  # KEEP of a key that is not the slot's last: unknown
    assert table.read(a)[1] is None and table.read(b)[1] is None
    table.close()


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


def test_rejects_a_foreign_file(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-table"
    bad.write_bytes(b"x" * 4096)
    with pytest.raises(ValueError, match="not a djcachebench generation table"):
        GenerationTable(str(bad))
    tiny = tmp_path / "tiny"
    tiny.write_bytes(b"x")
    with pytest.raises(ValueError, match="too small"):
        GenerationTable(str(tiny))


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
    conn.send([coherence._tokens.next() for _ in range(100)])


def test_forked_child_draws_other_tokens() -> None:
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=_child_tokens, args=(child_end,))
    proc.start()
    mine = [coherence._tokens.next() for _ in range(100)]
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
    assert all(table.token(f":1:w{i}")[2] != 0 for i in range(n))
    assert sorted(os.listdir(os.path.dirname(path))) == ["g.mmap"]
    table.close()


def _stamp_in_child(path: str, key: str) -> None:
    table = GenerationTable(path)
    table.stamp(key, 1234.0)
    table.close()


@pytest.mark.slow
def test_stamp_in_another_process_is_seen(table: GenerationTable) -> None:
    tok = table.token(":1:shared")
    proc = SPAWN.Process(target=_stamp_in_child, args=(table.path, ":1:shared"))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert not table.is_current(":1:shared", tok)
    assert table.read(":1:shared")[1] == 1234.0


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
    from djcachebench.board import NOT_PUBLISHED, ValueBoard, encode

    table = GenerationTable(str(tmp_path / "g"), slots=64)
    board = ValueBoard(str(tmp_path / "g.values"), 64, 32)
    off, fp = table.locate(":1:p")
    table.stamp(":1:p")
    token = table.token(":1:p")
    assert table.publish(board, token, 1e12, fp, *encode(b"new"))
    index = GenerationTable.slot_index(off)
    assert board.fetch(index, token[2], token[1], fp) == (b"new", 1e12)
    table.stamp(":1:p")  # a later write: the published value is no longer current
    assert not table.publish(board, token, 1e12, fp, *encode(b"late"))
    assert board.fetch(index, token[2], token[1], fp) == (b"new", 1e12)  # never rewritten
    fresh = table.token(":1:p")
    assert board.fetch(index, fresh[2], fresh[1], fp)[0] is NOT_PUBLISHED
    table.close()
    board.close()


def test_keep_from_carries_the_expiry_only_over_an_unbroken_chain(table: GenerationTable) -> None:
    from djcachebench.coherence import KeepFrom

    table.stamp(":1:n", 5000.0)
    token, expires = table.read(":1:n")
    GenerationTable.begin_chain()
    table.stamp(":1:n")  # an L2 that stamps without expiries (unknown)
    table.stamp(":1:n", KeepFrom(token, expires))
    GenerationTable.end_chain()
    assert table.read(":1:n")[1] == 5000.0
    token, expires = table.read(":1:n")
    table.stamp(":1:n", 7000.0)  # someone else's set, with its own expiry
    table.stamp(":1:n", KeepFrom(token, expires))
    assert table.read(":1:n")[1] is None  # 5000 would be wrong now, 7000 is not ours to know


def test_watch_is_shared_through_the_file_and_never_undone(tmp_path: Path) -> None:
    path = str(tmp_path / "generations.mmap")
    writer, reader = GenerationTable(path), GenerationTable(path)
    assert not writer.watched(), "a new table has no reader yet"
    reader.watch()
    assert writer.watched(), "a reader's watch() must reach other mappings of the file"
    reader.watch()  # idempotent
    reader.close()
    assert GenerationTable(path).watched(), "the word lives as long as the file"
