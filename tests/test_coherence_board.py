"""The value board on its own: what it carries, and what makes a fetch refuse."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from djcachebench.board import ABSENT, NOT_PUBLISHED, ValueBoard, encode


@pytest.fixture
def board(tmp_path: Path) -> Iterator[ValueBoard]:
    b = ValueBoard(str(tmp_path / "b.values"), slots=16, value_bytes=64)
    yield b
    b.close()


@pytest.mark.parametrize("value", [b"bytes", b"", "str \u00e9\u6e05", "", 0, -5, 2**63 - 1,
                                   1.5, math.inf, True, False, None, ABSENT])
def test_plain_values_round_trip(board: ValueBoard, value: object) -> None:
    board.write(3, 111, 7, 1e12, 42, *encode(value))
    got, expires = board.fetch(3, 111, 7, 42)
    assert got == value and type(got) is type(value) and expires == 1e12


@pytest.mark.parametrize("value", [[1], {"a": 1}, (1, 2), 2**63, object(), bytearray(b"x")])
def test_other_values_are_not_carried(value: object) -> None:
    assert encode(value) is None


def test_fetch_needs_token_epoch_and_fingerprint(board: ValueBoard) -> None:
    board.write(5, 111, 7, 1e12, 42, *encode("v"))
    assert board.fetch(5, 112, 7, 42) == (NOT_PUBLISHED, 0.0)
    assert board.fetch(5, 111, 8, 42) == (NOT_PUBLISHED, 0.0)
    assert board.fetch(5, 111, 7, 43) == (NOT_PUBLISHED, 0.0)
    assert board.fetch(6, 111, 7, 42) == (NOT_PUBLISHED, 0.0)  # never written
    assert board.fetch(5, 111, 7, 42)[0] == "v"


def test_a_slot_mid_update_is_refused(board: ValueBoard) -> None:
    board.write(2, 111, 7, 1e12, 42, *encode("v"))
    import struct

    struct.pack_into("<Q", board._mm, 64 + 2 * board.slot_size, 0)  # a writer's "busy"
    assert board.fetch(2, 111, 7, 42)[0] is NOT_PUBLISHED


def test_header_wins_and_foreign_files_are_refused(tmp_path: Path) -> None:
    first = ValueBoard(str(tmp_path / "b"), slots=16, value_bytes=64)
    second = ValueBoard(str(tmp_path / "b"), slots=16, value_bytes=500)
    assert second.max_value == first.max_value
    with pytest.raises(ValueError, match="not a value board for 32 slots"):
        ValueBoard(str(tmp_path / "b"), slots=32)
    (tmp_path / "junk").write_bytes(b"x" * 5000)
    with pytest.raises(ValueError):
        ValueBoard(str(tmp_path / "junk"), slots=16)
    first.close()
    second.close()
