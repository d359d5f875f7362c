"""How a Python value becomes a row: a sealed payload, raw or serialized.

Every value is sealed (see ``serializers.Sealer``): whoever can write a shard
must not be able to choose what a read returns, whether the value would run
code (a pickle) or not (bytes, a str, a number: a cached user id, a counter
or an HTML fragment is as much worth forging).

``bytes`` and ``str`` are stored as they are (``str`` as UTF-8), ``int``
within 64 bits as 8 bytes: they need no serializer, and skipping it spares a
serializer call on each read and write of the most common cached values
(rendered fragments, bytes, counters). ``bool`` is serialized (it must come back as
``bool``). Every other value is serialized; the ``kind`` column records which
serializer wrote it, so switching ``SERIALIZER`` turns old rows into misses
instead of decoding them with the wrong codec. The tag covers how a row is to
be read (its domain), so relabelling ``kind`` never makes raw bytes reach a
deserializer, nor the bytes of a str pass for a number.

Integers used to be stored as bare SQL integers (``KIND_INT``), unsealed, so
that ``incr`` could be one ``UPDATE ... SET value = value + ?``; anyone who
could write a shard could then set any cached integer. ``incr`` is still one
``UPDATE``, atomic across processes, but the sum is verified and sealed inside
it (:meth:`Codec.add_to_sealed_int`). A row of ``KIND_INT`` left by an earlier
version verifies under no key: it reads as a miss and never blocks ``add``
(``statements.SQL_ADD``).
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import memo_policy
from ..serializers import (
    RAW_BYTES,
    RAW_INT,
    RAW_STR,
    SHA_MIN,
    TAG_SIZE,
    PickleSerializer,
    Sealer,
    Serializer,
    serialized_domain,
)
from .statements import RawText
from .stats import Stats
from .values import KNOWN, VOUCHABLE, FileRead, Identity

if TYPE_CHECKING:
    from .vouch import VouchBoard

#: Bare SQL integers, written by earlier versions (unsealed): never read now.
KIND_INT = 0
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
_INT64 = struct.Struct(">q")

# Serializer ids stored in the ``kind`` column.
SERIALIZER_IDS = {
    "pickle": 1,
    "msgpack": 2,
}
CUSTOM_SERIALIZER_ID = 3
KIND_BYTES = 4
KIND_STR = 5
#: A 64-bit ``int``, sealed: 8 bytes, big-endian.
KIND_SINT = 6


def sql_key(key: str) -> str | bytes:
    """The key as bound to SQL: itself, or its bytes if it has a lone surrogate.

    Why: Django accepts any ``str`` key (LocMemCache stores ``"\\udc80"``),
    but the sqlite3 module cannot bind a ``str`` that is not valid UTF-8. Such
    a key is stored as a BLOB of its ``surrogatepass`` UTF-8 bytes instead;
    SQLite never finds a BLOB equal to a TEXT, so no other key can collide
    with it. ASCII keys (nearly all) cost one ``isascii()``.
    """
    if key.isascii():
        return key
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogatepass")
    return key


def text_key(stored: str | bytes) -> str:
    """A key read back from SQL (``RETURNING key``, scans) as the ``str`` it was."""
    if type(stored) is str:
        return stored
    if type(stored) is RawText:  # no caller's key: only to stamp and count it
        return stored.decode("utf-8", "surrogateescape")
    return stored.decode("utf-8", "surrogatepass")


class Tampered:
    """Sentinel type: the stored value failed its integrity check."""


TAMPERED = Tampered()


# The memo of verified rows (see Codec._open): rows up to VERIFIED_MAX_BLOB
# bytes, at most VERIFIED_MAX of them and VERIFIED_MAX_BYTES in all.
VERIFIED_MAX_BLOB = 64 * 1024
VERIFIED_MAX = 65536
VERIFIED_MAX_BYTES = 16 * 1024 * 1024
# Payloads of at least this many bytes are stored in a file beside the shard
# (store/values.py) instead of in the row: see docs/architecture.md, "Large
# values", for the measurements behind the threshold.
LARGE_MIN = 32 * 1024
# A sealed value longer than this, less its key's length, is kept in the
# ``blobs`` table and its row names it (``cache.blob``). Why: ``cache`` is a
# WITHOUT ROWID table, a B-tree of whole rows, and SQLite must read the whole
# of a row that spills onto overflow pages (beyond ~1,000 bytes with 4 KiB
# pages) into memory to compare its key with the one searched, at every step
# of every lookup that passes it; copies of such rows also sit in the interior
# pages. So a get of 10 KB values over 10,000 keys spends several times as long
# in its SELECT as with the value in a rowid table (docs/architecture.md,
# "Values in blobs"). 900 leaves room for the other columns under the spill.
INLINE_MAX = 900


def in_blob(key: str, stored: Any) -> bool:
    """Does this encoded value (``Codec.encode``'s second item) go to ``blobs``?"""
    return type(stored) is bytes and len(stored) + len(key) > INLINE_MAX


# Rows of SHA_MIN payload bytes or more are vouched for by a fingerprint once
# their tag verified (Codec.decode): Python's own hash of bytes, SipHash-1-3
# keyed by a 128-bit secret the interpreter draws at start-up, which nothing
# outside this process can read. It hashes several times faster than the tag
# (docs/benchmarks.md), and bytes altered on disk have another fingerprint unless
# the change happens to collide under a key the attacker never sees (2^-64 per
# attempt, each attempt a read). Where PYTHONHASHSEED fixes the key, it can be
# known: every such row is then verified by its tag at every read.
FINGERPRINTS = sys.flags.hash_randomization == 1 and os.environ.get(
    "PYTHONHASHSEED", "random") == "random"


def _by_fingerprint(stored: bytes) -> bool:
    """Is a row this long vouched for by its fingerprint (``Codec.decode``)?"""
    return FINGERPRINTS and len(stored) - TAG_SIZE >= SHA_MIN


class Large:
    """A value that goes to a file: its payload and the tag the row keeps."""

    __slots__ = ("payload", "tag")

    def __init__(self, tag: bytes, payload: bytes) -> None:
        self.tag = tag
        self.payload = payload


class Codec:
    """Encodes values for one cache (one serializer; one integrity key seals, older ones verify)."""

    __slots__ = (
        "_board",
        "_domains",
        "_dumps",
        "_fallbacks",
        "_files",
        "_kind",
        "_loads",
        "_memo",
        "_prints",
        "_sealer",
        "_serialized",
        "_verified",
        "_verified_bytes",
        "pickle_kind",
        "stats",
    )

    def __init__(
        self,
        serializer: Serializer,
        serializer_id: int,
        sealer: Sealer,
        fallbacks: Sequence[Sealer] = (),
        serializer_name: str | None = None,
    ) -> None:
        """``sealer`` seals every value written; a row is also accepted when it
        verifies under one of ``fallbacks`` (older keys, as Django's
        ``SECRET_KEY_FALLBACKS``), so processes on each side of a key rotation
        read each other's values instead of taking them for tampered.
        ``serializer_name`` (the ``SERIALIZER`` setting) is bound into the tag
        of every serialized value (``serialized_domain``); by default the name
        of its kind."""
        self._serialized = serialized_domain(
            f"kind:{serializer_id}" if serializer_name is None else serializer_name)
        self._dumps = serializer.dumps
        self._loads = serializer.loads
        self._kind = serializer_id
        # The kind of rows whose payload is a pickle (``pickle.loads`` reads it),
        # or None: with the default serializer, a caller that keeps a private
        # copy of a mutable value (TieredCache's L1) can keep the verified
        # payload instead of pickling the value again.
        self.pickle_kind = serializer_id if type(serializer) is PickleSerializer else None
        self._sealer = sealer
        self._fallbacks = tuple(fallbacks)
        self._verified: dict[tuple[str, bytes], bytes] = {}
        self._verified_bytes = 0
        self._memo = memo_policy.Judge(VERIFIED_MAX)  # whole or sampled (see _open)
        # (key, domain) -> (name, identity) of the value file whose tag verified
        # (or that the board vouched for), under the conditions of ValueFiles.read.
        self._files: dict[tuple[str, bytes], tuple[str, Identity]] = {}
        self._board: VouchBoard | None = None
        #: Where ``file_hashes`` and ``file_vouched`` are counted (the shard set's).
        self.stats = Stats()
        # (key, domain) -> fingerprint of the long row's payload whose tag
        # verified or that this process wrote (see decode).
        self._prints: dict[tuple[str, bytes], int] = {}
        # The tag domain of each kind of row this codec reads (one place for
        # the mapping; a row of any other kind is not ours to decode).
        self._domains = {serializer_id: self._serialized, KIND_BYTES: RAW_BYTES, KIND_STR: RAW_STR,
                         KIND_SINT: RAW_INT}

    def _open(self, key: str, blob: bytes, domain: bytes) -> bytes | None:
        """The payload of a sealed row, or ``None`` when its tag does not verify.

        Why a memo: a cached value is read many times between writes, and the
        tag (BLAKE2b over key and row) costs more than the SELECT on a row of
        a few kilobytes. A row is remembered only after its tag verified, as
        the exact bytes for its key and domain, and a later read is spared the
        tag only if its bytes are equal to those (a ``memcmp``, tens of times
        cheaper than the hash); a row altered on disk is different bytes and
        is verified again. The domain is part of the entry: bytes verified as
        raw bytes are not thereby verified as a pickle.

        Why it shrinks: over a key set much larger than the memo (a million
        sessions read at random), almost every lookup misses, and a whole memo
        holds ~20 MiB per process that buy nothing. So it keeps whole or
        sampled by ``memo_policy``.
        Either way a row is accepted only after its tag or an exact copy of
        bytes whose tag verified.
        """
        verified = self._verified
        memo_key = (key, domain)
        judge = self._memo
        if judge.whole or not hash(key) % memo_policy.SAMPLE:
            judge.lookups += 1
            if judge.lookups >= memo_policy.WINDOW and judge.judge():
                verified.clear()  # its next entries are the sample's
                self._verified_bytes = 0
            if verified.get(memo_key) == blob:
                judge.hits += 1
                return blob[TAG_SIZE:]
            remember = len(blob) <= VERIFIED_MAX_BLOB
        else:
            remember = False
        if _by_fingerprint(blob):
            # A long row's copy is kept only once its fingerprint answered, i.e.
            # on its second read: over many keys read about once each, copies
            # of rows never read again filled the memo with megabytes to free.
            payload, again = self._verify_long(key, blob, domain)
            remember = remember and again
        else:
            payload = self._verify(key, blob, domain)
        if payload is not None and remember:
            self._remember_verified(memo_key, blob)
        return payload

    def _remember_verified(self, memo_key: tuple[str, bytes], blob: bytes) -> None:
        """Enter exact bytes whose tag verifies (or that this process sealed)."""
        verified = self._verified
        scale = self._memo.scale
        if (len(verified) * scale >= VERIFIED_MAX
                or self._verified_bytes * scale >= VERIFIED_MAX_BYTES):
            verified.clear()
            self._verified_bytes = 0
        verified[memo_key] = blob
        self._verified_bytes += len(blob)

    def _verify(self, key: str, blob: bytes, domain: bytes) -> bytes | None:
        """The payload if the tag verifies under our key or a fallback, else None."""
        payload = self._sealer.open(key, blob, domain)
        if payload is None:
            for sealer in self._fallbacks:
                payload = sealer.open(key, blob, domain)
                if payload is not None:
                    break
        return payload

    def _payload(self, value: Any) -> tuple[int, bytes, bytes]:
        """``(kind, payload, domain)`` of a value, to be sealed."""
        kind = type(value)
        if kind is int and INT_MIN <= value <= INT_MAX:
            return KIND_SINT, _INT64.pack(value), RAW_INT
        if kind is bytes:
            return KIND_BYTES, value, RAW_BYTES
        if kind is str:
            return KIND_STR, value.encode("utf-8", "surrogatepass"), RAW_STR
        payload = self._dumps(value)
        if type(payload) is not bytes:
            payload = self._bytes_of(payload)
        return self._kind, payload, self._serialized

    def _bytes_of(self, payload: Any) -> bytes:
        """A serializer's output that is not ``bytes``: bytes-like is taken as its
        bytes; anything else (a ``str`` from a JSON serializer) is refused with an
        error that names the serializer, not a bare one from the sealing below."""
        try:
            return bytes(memoryview(payload))
        except TypeError:
            raise TypeError(
                f"the SERIALIZER's dumps() must return bytes; {self._dumps!r} returned "
                f"{type(payload).__name__}") from None

    def encode(self, key: str, value: Any) -> tuple[int, Any, int]:
        """``(kind, stored value, size in bytes)``. Serializer errors propagate.

        The stored value is what the row's ``value`` column holds, or a
        :class:`Large` for a payload of ``LARGE_MIN`` bytes or more, which
        goes to a file; ``size`` counts payload and tag either way.
        """
        # Raw bytes, the commonest value of a disk cache, skip _payload's frame.
        if type(value) is bytes:
            kind, payload, domain = KIND_BYTES, value, RAW_BYTES
        else:
            kind, payload, domain = self._payload(value)
        if len(payload) >= LARGE_MIN:
            tag = self._sealer.tag_large(key, payload, domain)
            return kind, Large(tag, payload), len(payload) + TAG_SIZE
        blob = self._sealer.seal(key, payload, domain)
        return kind, blob, len(blob)

    def share(self, board: VouchBoard) -> None:
        """Vouch for value files through ``board``, shared by the host's processes."""
        self._board = board

    def known_file(self, key: str, kind: int,
                   name: str) -> Callable[[Identity], bool] | None:
        """For ``ValueFiles.read``: was value file ``name``, with a given identity,
        verified for this key and kind, by this process or (the board) another?"""
        domain = self._domains.get(kind)
        if domain is None:
            return None
        mine = self._files.get((key, domain))

        def known(ident: Identity) -> bool:
            if mine == (name, ident):
                return True
            board = self._board
            if board is not None and board.vouched(name, ident, key, domain):
                self._remember_file(key, domain, name, ident)
                self.stats.file_vouched += 1
                return True
            return False

        return known

    def _remember_file(self, key: str, domain: bytes, name: str, ident: Identity) -> None:
        files = self._files
        if len(files) >= VERIFIED_MAX:
            files.clear()
        files[(key, domain)] = (name, ident)

    def _check_file(self, key: str, kind: int, tag: Any, name: str, read: FileRead) -> bool:
        """Does the payload read from value file ``name`` verify under ``tag``?

        Why a file is vouched for by its identity (``values.identity``: inode,
        size, modification and change times) once its tag verified: hashing a
        large value costs several times reading it from the page cache. A read
        that ``ValueFiles.read`` found ``KNOWN`` (an identity vouched for,
        unchanged through the read) is accepted as it is. Any other is hashed,
        and its identity remembered, here and on the host's board, only if the
        read was ``VOUCHABLE``: looked at while nobody had the file open for
        writing (so no mapping could change it unseen), unchanged through the
        read, on a file whose any later change will show in its times.
        """
        domain = self._domains.get(kind)
        if domain is None or type(tag) is not bytes:
            return False
        if read.trust == KNOWN:
            return True
        self.stats.file_hashes += 1
        for sealer in (self._sealer, *self._fallbacks):
            if sealer.check_large(key, read.payload, domain, tag):
                ident = read.ident
                if read.trust == VOUCHABLE and ident is not None:
                    self._remember_file(key, domain, name, ident)
                    # The board is read by every process with our current key,
                    # including those that no longer accept a fallback (a key
                    # dropped because it leaked): a file sealed under one is
                    # vouched for in this process only, or a process with the
                    # new key alone would take such a file on another's word.
                    if self._board is not None and sealer is self._sealer:
                        self._board.vouch(name, ident, key, domain)
                return True
        return False

    def decode_file(self, key: str, kind: int, tag: Any, name: str, read: FileRead) -> Any:
        """The value read from a value file (``ValueFiles.read``), or ``TAMPERED``."""
        if not self._check_file(key, kind, tag, name, read):
            return TAMPERED
        return self._value(kind, read.payload)

    def verify_file(self, key: str, kind: int, tag: Any, name: str, read: FileRead) -> bool:
        """Would :meth:`decode_file` accept it? Decodes nothing."""
        return self._check_file(key, kind, tag, name, read)

    def verify(self, key: str, kind: int, stored: Any) -> bool:
        """Would :meth:`decode` accept this row? Checks the tag, decodes nothing."""
        domain = self._domains.get(kind)
        return (
            domain is not None
            and type(stored) is bytes
            and self._open(key, stored, domain) is not None
        )

    def decode(self, key: str, kind: int, stored: Any) -> Any:
        """The value, or ``TAMPERED`` if it was altered or written by another codec.

        Rows go through ``_open``: its memo of exact bytes first. Behind it, a
        row of ``SHA_MIN`` payload bytes or more is vouched for by its
        fingerprint (``FINGERPRINTS``, ``_verify_long``) once its tag verified:
        its tag costs more than its SELECT when many such rows are read, and
        the exact-bytes memo cannot hold thousands of them. The fingerprint is
        taken of the bytes read, at every read, so bytes altered on disk are
        verified again (and found tampered) before anything is returned or
        deserialized.
        """
        domain = self._domains.get(kind)
        if domain is None or type(stored) is not bytes:
            return TAMPERED
        payload = self._open(key, stored, domain)
        if payload is None:
            return TAMPERED
        if kind == KIND_BYTES:  # _value's first case, spared its frame
            return payload
        return self._value(kind, payload)

    def _verify_long(self, key: str, blob: bytes,
                     domain: bytes) -> tuple[bytes | None, bool]:
        """``_verify`` for a row long enough to be vouched for by its fingerprint
        (``_by_fingerprint``): the bytes read are fingerprinted every time, and
        only a fingerprint whose bytes verified spares the tag. Also says
        whether the fingerprint was known (these bytes were seen before)."""
        payload = blob[TAG_SIZE:]
        memo_key = (key, domain)
        fingerprint = hash(payload)
        if self._prints.get(memo_key) == fingerprint:
            return payload, True
        if self._verify(key, blob, domain) is None:
            return None, False
        self._remember_print(memo_key, fingerprint)
        return payload, False

    def add_to_sealed_int(self, key: str | bytes, stored: Any, delta: int) -> bytes:
        """``stored`` (a sealed 64-bit int of ``key``) plus ``delta``, sealed.

        Called by SQLite inside ``incr``'s one ``UPDATE`` (``statements.SQL_INCR``,
        registered as ``djcb_incr`` on every connection), so that the sum is
        taken and sealed in the statement's own write transaction: atomic
        across processes as a bare ``value + ?`` was, and verified first.
        Raises when it cannot (a row that does not verify, a sum past 64 bits):
        the statement then fails and ``incr`` takes its read-modify-write path,
        which says why (``ValueError``) or stores the sum serialized.
        """
        if type(stored) is not bytes:
            raise ValueError("not a sealed integer")
        if type(key) is not str:  # the row's key column: a BLOB for a lone surrogate
            key = text_key(key)
        payload = self._open(key, stored, RAW_INT)
        if payload is None or len(payload) != _INT64.size:
            raise ValueError("not a sealed integer of this key")
        new = _INT64.unpack(payload)[0] + delta
        if not INT_MIN <= new <= INT_MAX:
            raise ValueError("past 64 bits")  # (an OverflowError would read as SQLITE_TOOBIG)
        blob = self._sealer.seal(key, _INT64.pack(new), RAW_INT)
        # Sealed here: the next incr or get of a hot counter compares bytes
        # instead of hashing them (if the statement fails, the entry is only
        # bytes that the row does not hold). Under the rule _open keeps.
        if self._memo.whole or not hash(key) % memo_policy.SAMPLE:
            self._remember_verified((key, RAW_INT), blob)
        return blob

    @staticmethod
    def sealed_int(blob: bytes) -> int:
        """The int of a row this process has just sealed (``add_to_sealed_int``)."""
        return _INT64.unpack_from(blob, TAG_SIZE)[0]

    def remember_written(self, key: str, kind: int, stored: bytes) -> None:
        """This process wrote ``stored`` (sealed by it) in a row: its fingerprint
        vouches for the bytes when it reads them back (``_verify_long``)."""
        domain = self._domains.get(kind)
        if domain is not None and _by_fingerprint(stored):
            self._remember_print((key, domain), hash(stored[TAG_SIZE:]))

    def _remember_print(self, memo_key: tuple[str, bytes], fingerprint: int) -> None:
        prints = self._prints
        if len(prints) >= VERIFIED_MAX:
            prints.clear()
        prints[memo_key] = fingerprint

    def _value(self, kind: int, payload: bytes) -> Any:
        """A verified payload as the value it was stored from (rows and files alike)."""
        if kind == KIND_BYTES:
            return payload
        if kind == KIND_STR:
            return payload.decode("utf-8", "surrogatepass")
        if kind == KIND_SINT:
            return _INT64.unpack(payload)[0]
        return self._loads(payload)
