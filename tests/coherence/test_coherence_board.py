"""The value board on its own: what it carries, and what makes a fetch refuse."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from djcachebench.coherence.board import (
    ABSENT,
    EXPIRY_ONLY,
    NOT_PUBLISHED,
    ValueBoard,
    board_key,
    encode,
    open_board,
)

KEY = board_key(b"board-test-not-secret")


@pytest.fixture
def board(tmp_path: Path) -> Iterator[ValueBoard]:
    b = ValueBoard(str(tmp_path / "b.values"), slots=16, value_bytes=64, key=KEY)
    yield b
    b.close()


@pytest.mark.parametrize("value", [b"bytes", b"", "str \u00e9\u6e05", "", 0, -5, 2**63 - 1,
                                   1.5, math.inf, True, False, None, ABSENT])
def test_plain_values_round_trip(board: ValueBoard, value: object) -> None:
    assert board.write(3, (111, 9), 7, 1e12, b":1:k", *encode(value))
    got, expires = board.fetch(3, (111, 9), 7, b":1:k")
    assert got == value and type(got) is type(value) and expires == 1e12


@pytest.mark.parametrize("value", [[1], {"a": 1}, (1, 2), 2**63, object(), bytearray(b"x")])
def test_other_values_are_not_carried(value: object) -> None:
    assert encode(value) is None


def test_fetch_needs_token_epoch_and_the_very_key(board: ValueBoard) -> None:
    board.write(5, (111, 9), 7, 1e12, b":1:k", *encode("v"))
    assert board.fetch(5, (112, 9), 7, b":1:k") == (NOT_PUBLISHED, 0.0)
    assert board.fetch(5, (111, 9), 8, b":1:k") == (NOT_PUBLISHED, 0.0)
    assert board.fetch(6, (111, 9), 7, b":1:k") == (NOT_PUBLISHED, 0.0)  # never written
    assert board.fetch(5, (111, 9), 7, b":1:k")[0] == "v"


@pytest.mark.parametrize("other", [b":1:j", b":1:k ", b":1:", b":1:K", b":2:k"])
def test_another_key_in_the_same_slot_never_gets_the_value(board: ValueBoard,
                                                            other: bytes) -> None:
    """Defect: the board told keys apart by a 32-bit fingerprint, so two keys that
    collided on it were one key to every reader. It now compares the whole key."""
    board.write(5, (111, 9), 7, 1e12, b":1:k", *encode("secret of k"))
    assert board.fetch(5, (111, 9), 7, other) == (NOT_PUBLISHED, 0.0)


def test_key_and_value_that_do_not_fit_are_not_published(board: ValueBoard) -> None:
    assert not board.write(1, (111, 9), 7, 1e12, b"k" * 40, *encode(b"v" * 40))
    assert board.fetch(1, (111, 9), 7, b"k" * 40)[0] is NOT_PUBLISHED


def test_expiry_alone(board: ValueBoard) -> None:
    board.write(4, (111, 9), 7, 1234.5, b":1:k", *encode(EXPIRY_ONLY))
    assert board.expiry(4, (111, 9), 7, b":1:k") == 1234.5
    assert board.expiry(4, (111, 9), 7, b":1:x") is None
    board.write(4, (112, 9), 7, 0.0, b":1:k", *encode(ABSENT))
    assert board.expiry(4, (112, 9), 7, b":1:k") is None


def test_a_slot_mid_update_is_refused(board: ValueBoard) -> None:
    board.write(2, (111, 9), 7, 1e12, b":1:k", *encode("v"))
    os.pwrite(board._fd, struct.pack("<Q", 0), 64 + 2 * board.slot_size)  # a writer's "busy"
    assert board.fetch(2, (111, 9), 7, b":1:k")[0] is NOT_PUBLISHED


def test_header_wins_and_other_boards_are_replaced(tmp_path: Path) -> None:
    first = ValueBoard(str(tmp_path / "b"), slots=16, value_bytes=64, key=KEY)
    second = ValueBoard(str(tmp_path / "b"), slots=16, value_bytes=500, key=KEY)
    assert second.max_value == first.max_value
    other = ValueBoard(str(tmp_path / "b"), slots=32, key=KEY)  # another table size: a new board
    assert other.slots == 32
    first.close()
    second.close()
    other.close()


def test_a_truncated_board_is_re_extended_before_it_is_touched(tmp_path: Path) -> None:
    """Defect: the board was a sparse file written through a shared mapping, so a
    truncation (or a full disk) killed its readers and writers with SIGBUS. It is
    allocated, and its size is checked before it is touched: a truncated board is
    re-extended, and what was lost reads as not published."""
    import time

    from djcachebench.coherence.board import CHECK_EVERY

    path = tmp_path / "b"
    b = ValueBoard(str(path), slots=200, value_bytes=64, key=KEY)
    st = path.stat()
    assert st.st_blocks * 512 >= st.st_size, "allocated, not sparse"
    b.write(150, (111, 9), 7, 1e12, b":1:k", *encode("v"))  # beyond the first page
    os.truncate(path, 100)
    time.sleep(CHECK_EVERY * 5)
    assert b.fetch(150, (111, 9), 7, b":1:k")[0] is NOT_PUBLISHED
    assert path.stat().st_size == st.st_size
    assert b.write(150, (112, 9), 7, 1e12, b":1:k", *encode("w"))
    assert b.fetch(150, (112, 9), 7, b":1:k")[0] == "w"
    b.close()


def test_an_unusable_board_path_means_no_board(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    assert open_board(str(tmp_path / "dir"), 16, 64, KEY) is None


def test_a_value_is_served_only_under_its_stamp_and_mark(tmp_path: Path) -> None:
    """The table's token is a (stamp, mark) pair: a value published under one
    mark is not served when the slot's mark has moved on (another write's
    transaction began), even if the stamp is the same."""
    board = ValueBoard(str(tmp_path / "b"), slots=8, value_bytes=64, key=KEY)
    board.write(5, (111, 9), 7, 1e12, b":1:k", *encode("v"))
    assert board.fetch(5, (111, 9), 7, b":1:k")[0] == "v"
    assert board.fetch(5, (111, 10), 7, b":1:k") == (NOT_PUBLISHED, 0.0)
    assert board.fetch(5, (111, 0), 7, b":1:k") == (NOT_PUBLISHED, 0.0)


def test_a_slot_altered_in_the_file_is_not_published(tmp_path: Path) -> None:
    """Defect: the board carried no tag, so whoever could write the file put any
    plain value under the current token of any key, and every process served it.
    Each byte a reader takes is under the slot's tag now: a value, key, expiry
    or kind altered in the file is read as not published (and counted)."""
    path = tmp_path / "b"
    board = ValueBoard(str(path), slots=8, value_bytes=64, key=KEY)
    at = 64 + 5 * board.slot_size
    for field, offset, data in (("value", 56 + 4, b"EVIL"), ("key", 56, b":2:k"),
                                ("expiry", 24, struct.pack("<d", math.inf)),
                                ("kind", 32, bytes([1]))):
        assert board.write(5, (111, 9), 7, 1e12, b":1:k", *encode("good"))
        assert board.fetch(5, (111, 9), 7, b":1:k") == ("good", 1e12)
        os.pwrite(board._fd, data, at + offset)
        forged = board.forged
        assert board.fetch(5, (111, 9), 7, b":1:k" if field != "key" else b":2:k") == (
            NOT_PUBLISHED, 0.0), field
        assert board.forged == forged + 1, field
    board.close()


def test_a_board_written_under_another_key_is_not_read(tmp_path: Path) -> None:
    """Processes with another SECRET_KEY (or a forger without it) share the file
    but none of its values."""
    ours = ValueBoard(str(tmp_path / "b"), slots=8, value_bytes=64, key=KEY)
    theirs = ValueBoard(str(tmp_path / "b"), slots=8, value_bytes=64,
                        key=board_key(b"another-secret"))
    theirs.write(3, (111, 9), 7, 1e12, b":1:k", *encode(b"theirs"))
    assert theirs.fetch(3, (111, 9), 7, b":1:k")[0] == b"theirs"
    assert ours.fetch(3, (111, 9), 7, b":1:k") == (NOT_PUBLISHED, 0.0)
    ours.close()
    theirs.close()
