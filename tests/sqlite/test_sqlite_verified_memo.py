"""The memo of verified rows pays where reads repeat and shrinks where they do not.

Pinned (``store/codec.py``, ``Codec._open``): the memo spares a re-read row its
integrity tag only for the exact bytes that verified. Over a key set much
larger than it, almost every lookup misses and a full memo only holds
megabytes the SELECT would rather have in the CPU's caches, so after a window
whose hit rate is under ``memo_policy.KEEP`` it keeps a hash sample of the keys
(at that fraction of its capacity); it grows back when the sample's hit rate
says the whole memo would pay. Whole or sampled, nothing unverified is ever
decoded.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from djcachebench import memo_policy
from djcachebench.memo_policy import SAMPLE as MEMO_SAMPLE
from djcachebench.serializers import PickleSerializer, Sealer, derive_tag_key
from djcachebench.store import codec as codec_module
from djcachebench.store.codec import TAMPERED, Codec

CAPACITY = 512  # rows the whole memo holds in these tests
WINDOW = 256


@pytest.fixture
def codec(monkeypatch: pytest.MonkeyPatch) -> Codec:
    monkeypatch.setattr(codec_module, "VERIFIED_MAX", CAPACITY)
    monkeypatch.setattr(memo_policy, "WINDOW", WINDOW)
    return Codec(PickleSerializer(), 1, Sealer(derive_tag_key(b"memo-test-secret")))


def sealed(codec: Codec, keys: list[str]) -> dict[str, tuple[int, Any]]:
    rows = {}
    for key in keys:
        kind, blob, _ = codec.encode(key, {"key": key})
        rows[key] = (kind, blob)
    return rows


def read_all(codec: Codec, rows: dict[str, tuple[int, Any]], rounds: int) -> None:
    for _ in range(rounds):
        for key, (kind, blob) in rows.items():
            assert codec.decode(key, kind, blob) == {"key": key}


def test_a_key_set_much_larger_than_the_memo_leaves_only_a_sample_in_it(codec: Codec) -> None:
    """Before the memo judged itself, it filled to its capacity whatever it hit."""
    rows = sealed(codec, [f":1:spread-{i}" for i in range(20 * CAPACITY)])
    read_all(codec, rows, 1)  # every lookup a miss: no key is read twice
    assert not codec._memo.whole
    assert len(codec._verified) <= CAPACITY // MEMO_SAMPLE  # the sample's capacity


def test_a_hot_key_set_keeps_the_whole_memo_and_gets_it_back(codec: Codec) -> None:
    # Half the capacity: enough keys that some fall in the sample whatever the
    # hash seed (none of 256, one time in 15 million).
    hot = sealed(codec, [f":1:hot-{i}" for i in range(CAPACITY // 2)])
    read_all(codec, hot, 20)
    assert codec._memo.whole  # nearly every lookup hits: it pays
    read_all(codec, sealed(codec, [f":1:spread-{i}" for i in range(20 * CAPACITY)]), 1)
    assert not codec._memo.whole
    # The hot set again: the sampled keys hit, so the whole memo comes back
    # within a few windows of sampled lookups, and then holds every hot row.
    read_all(codec, hot, 8 * WINDOW * MEMO_SAMPLE // len(hot))
    assert codec._memo.whole
    read_all(codec, hot, 2)
    domain = codec._serialized
    assert all(codec._verified.get((key, domain)) == blob for key, (_, blob) in hot.items())


@pytest.mark.parametrize("phase", ["whole", "sampled"])
def test_altered_bytes_are_verified_again_whole_or_sampled(codec: Codec, phase: str) -> None:
    if phase == "sampled":
        read_all(codec, sealed(codec, [f":1:spread-{i}" for i in range(20 * CAPACITY)]), 1)
        assert not codec._memo.whole
    rows = sealed(codec, [f":1:k{i}" for i in range(4 * MEMO_SAMPLE)])
    read_all(codec, rows, 3)  # whatever the memo now remembers of them
    for key, (kind, blob) in rows.items():
        evil = pickle.dumps({"key": "evil"})
        forged = blob[:-len(evil)] + evil if len(blob) > len(evil) else blob + b"x"
        assert codec.decode(key, kind, forged) is TAMPERED
        # Another key's verified row, moved here, is refused too.
        other = next(k for k in rows if k != key)
        assert codec.decode(key, kind, rows[other][1]) is TAMPERED


def test_a_hot_set_larger_than_a_window_keeps_the_whole_memo(codec: Codec) -> None:
    """Judged from its first window, a memo filling with a hot set of more keys
    than a window saw only misses and shrank; regrown, it shrank again at the
    next window (all fills), and never held the set."""
    hot = sealed(codec, [f":1:hot-{i}" for i in range(WINDOW + WINDOW // 2)])  # < CAPACITY
    read_all(codec, hot, 30)
    assert codec._memo.whole
    domain = codec._serialized
    assert all(codec._verified.get((key, domain)) == blob for key, (_, blob) in hot.items())
