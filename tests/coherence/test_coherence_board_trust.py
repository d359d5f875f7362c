"""What a TieredCache reader takes from the value board: never another key's value (two
keys whose fingerprints collide in one slot), never a value planted in the board's file.

Each test pins one of these refusals.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.tiered.helpers import locmem_tiered, sqlite_tiered


def _fingerprint_collision(prefix: str) -> tuple[str, str]:
    """Two keys whose final keys (``:1:`` + key) agree on the 32 bits that used to
    tell keys apart on the value board (the high half of an 8-byte BLAKE2b)."""
    seen: dict[bytes, str] = {}
    for i in range(2_000_000):
        key = f"{prefix}{i}"
        fp = hashlib.blake2b(f":1:{key}".encode(), digest_size=8).digest()[4:]
        other = seen.get(fp)
        if other is not None:
            return other, key
        seen[fp] = key
    raise AssertionError("no collision found")


def test_a_colliding_key_never_gets_another_keys_value(tmp_path: Path) -> None:
    """Defect 1: with every key in one slot, a key whose 32-bit fingerprint matched
    another's took that key's value from the value board."""
    a, b = _fingerprint_collision("page-")
    writer = locmem_tiered(tmp_path, GENERATION_SLOTS=1, L1_MAX_ENTRIES=100)
    reader = locmem_tiered(tmp_path, GENERATION_SLOTS=1, L1_MAX_ENTRIES=101)
    writer.set(a, "value of a")
    assert reader.get(a) == "value of a"  # now in the reader's L1
    writer.set(b, "value of b")  # same slot: the reader's entry for a is invalidated
    assert reader.get(a) == "value of a"
    assert reader.get(b) == "value of b"
    assert writer.get(a) == "value of a"


def test_a_value_planted_on_the_board_is_not_served(tmp_path: Path) -> None:
    """Defect: whoever could write the value board's file (beside the generation
    table) made every process serve any plain value for any key, although the
    L2's rows (ShardedSQLiteCache) carry integrity tags: a reader whose L1 entry
    a write made stale took the value from the board, unchecked. Board slots are
    tagged under a key derived from SECRET_KEY now; a planted one is not served,
    and the reader goes to the L2."""
    writer = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=100)
    reader = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=101)  # another L1: another process
    writer.set("page", "first version")
    assert reader.get("page") == "first version"  # in the reader's L1
    writer.set("page", "<p>the real page</p>")  # published on the board
    board = writer._board
    assert board is not None
    data = Path(board.path).read_bytes()
    at = data.index(b"<p>the real page</p>")
    with open(board.path, "r+b") as f:  # same length, same token: only the bytes differ
        f.seek(at)
        f.write(b"<p>attacker's page</p>"[:20])
    got = reader.get("page")
    assert got == "<p>the real page</p>", got
    assert reader._board is not None and reader._board.forged >= 1
    assert reader.stats()["board_forged"] >= 1
