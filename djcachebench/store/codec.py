"""How a Python value becomes a row: native integers, or a sealed serialized blob.

Why integers are special: ``incr``/``decr`` must be atomic across processes,
and the cheapest atomic read-modify-write SQLite offers is one ``UPDATE ...
SET value = value + ?`` statement. That needs the number stored as an SQL
INTEGER, so ``int`` values within 64 bits are stored as such (``bool`` is not:
it must come back as ``bool``). An SQL integer is never unpickled, so it needs
no integrity tag: altering it on disk changes a number, never runs code.

``bytes`` and ``str`` are stored as they are (``str`` as UTF-8), sealed: they
need no serializer, and skipping it spares ~0.3 µs on each read and write of
the most common cached values (rendered fragments, bytes). Every other value
is serialized and sealed (see ``serializers.Sealer``); the ``kind`` column
records which serializer wrote it, so switching ``SERIALIZER`` turns old rows
into misses instead of decoding them with the wrong codec. The tag covers how
a row is to be read (its domain), so relabelling ``kind`` never makes raw
bytes reach a deserializer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import memo_policy
from ..serializers import RAW_BYTES, RAW_STR, SERIALIZED, SHA_MIN, TAG_SIZE, Sealer, Serializer

KIND_INT = 0
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1

# Serializer ids stored in the ``kind`` column.
SERIALIZER_IDS = {
    "pickle": 1,
    "msgpack": 2,
}
CUSTOM_SERIALIZER_ID = 3
KIND_BYTES = 4
KIND_STR = 5


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
    return stored if type(stored) is str else stored.decode("utf-8", "surrogatepass")


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
# pages. A get of 10 KB values over 10,000 keys spent 78 µs in its SELECT
# against 23 µs with the value in a rowid table (docs/architecture.md,
# "Values in blobs"). 900 leaves room for the other columns under the spill.
INLINE_MAX = 900


def in_blob(key: str, stored: Any) -> bool:
    """Does this encoded value (``Codec.encode``'s second item) go to ``blobs``?"""
    return type(stored) is bytes and len(stored) + len(key) > INLINE_MAX


def _by_version(domain: bytes, stored: bytes) -> bool:
    """Is a row of this domain and length trusted by its version (``Codec.decode``)?"""
    return domain != SERIALIZED and len(stored) - TAG_SIZE >= SHA_MIN


class Large:
    """A value that goes to a file: its payload and the tag the row keeps."""

    __slots__ = ("payload", "tag")

    def __init__(self, tag: bytes, payload: bytes) -> None:
        self.tag = tag
        self.payload = payload


class Codec:
    """Encodes values for one cache (one serializer; one integrity key seals, older ones verify)."""

    __slots__ = (
        "_domains",
        "_dumps",
        "_fallbacks",
        "_files",
        "_kind",
        "_loads",
        "_memo",
        "_sealer",
        "_verified",
        "_verified_bytes",
        "_versions",
    )

    def __init__(
        self,
        serializer: Serializer,
        serializer_id: int,
        sealer: Sealer,
        fallbacks: Sequence[Sealer] = (),
    ) -> None:
        """``sealer`` seals every value written; a row is also accepted when it
        verifies under one of ``fallbacks`` (older keys, as Django's
        ``SECRET_KEY_FALLBACKS``), so processes on each side of a key rotation
        read each other's values instead of taking them for tampered."""
        self._dumps = serializer.dumps
        self._loads = serializer.loads
        self._kind = serializer_id
        self._sealer = sealer
        self._fallbacks = tuple(fallbacks)
        self._verified: dict[tuple[str, bytes], bytes] = {}
        self._verified_bytes = 0
        self._memo = memo_policy.Judge(VERIFIED_MAX)  # whole or sampled (see _open)
        # (key, domain) -> name of the value file whose tag verified (raw domains only).
        self._files: dict[tuple[str, bytes], str] = {}
        # (key, domain) -> version (``stored``) of the long raw row whose tag
        # verified or that this process wrote (see decode).
        self._versions: dict[tuple[str, bytes], int] = {}
        # The tag domain of each kind of row this codec reads (one place for
        # the mapping; a row of any other kind is not ours to decode).
        self._domains = {serializer_id: SERIALIZED, KIND_BYTES: RAW_BYTES, KIND_STR: RAW_STR}

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
        payload = self._verify(key, blob, domain)
        if payload is not None and remember:
            if (len(verified) * judge.scale >= VERIFIED_MAX
                    or self._verified_bytes * judge.scale >= VERIFIED_MAX_BYTES):
                verified.clear()
                self._verified_bytes = 0
            verified[memo_key] = blob
            self._verified_bytes += len(blob)
        return payload

    def _verify(self, key: str, blob: bytes, domain: bytes) -> bytes | None:
        """The payload if the tag verifies under our key or a fallback, else None."""
        payload = self._sealer.open(key, blob, domain)
        if payload is None:
            for sealer in self._fallbacks:
                payload = sealer.open(key, blob, domain)
                if payload is not None:
                    break
        return payload

    def _payload(self, value: Any) -> tuple[int, bytes, bytes] | None:
        """``(kind, payload, domain)`` of a value stored sealed; ``None`` for an SQL int."""
        kind = type(value)
        if kind is int and INT_MIN <= value <= INT_MAX:
            return None
        if kind is bytes:
            return KIND_BYTES, value, RAW_BYTES
        if kind is str:
            return KIND_STR, value.encode("utf-8", "surrogatepass"), RAW_STR
        return self._kind, self._dumps(value), SERIALIZED

    def encode(self, key: str, value: Any) -> tuple[int, Any, int]:
        """``(kind, stored value, size in bytes)``. Serializer errors propagate.

        The stored value is what the row's ``value`` column holds, or a
        :class:`Large` for a payload of ``LARGE_MIN`` bytes or more, which
        goes to a file; ``size`` counts payload and tag either way.
        """
        encoded = self._payload(value)
        if encoded is None:
            return KIND_INT, value, 8
        kind, payload, domain = encoded
        if len(payload) >= LARGE_MIN:
            tag = self._sealer.tag_large(key, payload, domain)
            return kind, Large(tag, payload), len(payload) + TAG_SIZE
        blob = self._sealer.seal(key, payload, domain)
        return kind, blob, len(blob)

    def remember_file(self, key: str, kind: int, name: str) -> None:
        """The value file ``name`` was written by this process with a tag it made."""
        domain = self._domains.get(kind)
        if domain is not None and domain != SERIALIZED:
            self._remember_name(key, domain, name)

    def _remember_name(self, key: str, domain: bytes, name: str) -> None:
        files = self._files
        if len(files) >= VERIFIED_MAX:
            files.clear()
        files[(key, domain)] = name

    def _check_file(self, key: str, kind: int, tag: Any, name: str, payload: bytes) -> bool:
        """Does the payload read from value file ``name`` verify under ``tag``?

        Why raw values are remembered by file name: hashing a large value costs
        several times reading it from the page cache, and each write makes a
        file of a new random name (the row's version). A process that verified
        a file trusts it until the row names another file; a file altered in
        place afterwards would be returned to it as raw bytes or text. A
        serialized value is checked on every read: unverified bytes never reach
        the deserializer, whatever this process has seen before.
        """
        domain = self._domains.get(kind)
        if domain is None or type(tag) is not bytes:
            return False
        if domain != SERIALIZED and self._files.get((key, domain)) == name:
            return True
        for sealer in (self._sealer, *self._fallbacks):
            if sealer.check_large(key, payload, domain, tag):
                if domain != SERIALIZED:
                    self._remember_name(key, domain, name)
                return True
        return False

    def decode_file(self, key: str, kind: int, tag: Any, name: str, payload: bytes) -> Any:
        """The value read from a value file, or ``TAMPERED``."""
        if not self._check_file(key, kind, tag, name, payload):
            return TAMPERED
        return self._value(kind, payload)

    def verify_file(self, key: str, kind: int, tag: Any, name: str, payload: bytes) -> bool:
        """Would :meth:`decode_file` accept it? Decodes nothing."""
        return self._check_file(key, kind, tag, name, payload)

    def verify(self, key: str, kind: int, stored: Any) -> bool:
        """Would :meth:`decode` accept this row? Checks the tag, decodes nothing."""
        if kind == KIND_INT:
            return type(stored) is int
        domain = self._domains.get(kind)
        return (
            domain is not None
            and type(stored) is bytes
            and self._open(key, stored, domain) is not None
        )

    def decode(self, key: str, kind: int, stored: Any, version: int = 0) -> Any:
        """The value, or ``TAMPERED`` if it was altered or written by another codec.

        ``version`` is the row's ``stored`` (the write's time in ns; 0: not
        known). Why a raw row of ``SHA_MIN`` bytes or more is trusted by it once
        verified: its tag costs more than its SELECT when many such rows are
        read (~9 µs at 10 KB, more than the verified-row memo can hold at
        thousands of keys), and every write gives the row a new ``stored``.
        A process that verified a version, or wrote it, trusts that version
        until the row has another; bytes altered in place afterwards without
        changing ``stored`` would be returned to it as raw bytes or text, as
        for a value file (see ``_check_file``). A serialized value is checked
        on every read: unverified bytes never reach the deserializer.
        """
        if kind == KIND_INT:
            if type(stored) is not int:
                return TAMPERED
            return stored
        domain = self._domains.get(kind)
        if domain is None or type(stored) is not bytes:
            return TAMPERED
        if version and _by_version(domain, stored):
            memo_key = (key, domain)
            if self._versions.get(memo_key) == version:
                return self._value(kind, stored[TAG_SIZE:])
            # Not through _open: its copy of the bytes would never be compared.
            payload = self._verify(key, stored, domain)
            if payload is None:
                return TAMPERED
            self._remember_version(memo_key, version)
            return self._value(kind, payload)
        payload = self._open(key, stored, domain)
        if payload is None:
            return TAMPERED
        return self._value(kind, payload)

    def remember_version(self, key: str, kind: int, stored: bytes, version: int) -> None:
        """This process wrote ``stored`` (sealed by it) as version ``version`` of a row."""
        domain = self._domains.get(kind)
        if domain is not None and _by_version(domain, stored):
            self._remember_version((key, domain), version)

    def _remember_version(self, memo_key: tuple[str, bytes], version: int) -> None:
        versions = self._versions
        if len(versions) >= VERIFIED_MAX:
            versions.clear()
        versions[memo_key] = version

    def _value(self, kind: int, payload: bytes) -> Any:
        """A verified payload as the value it was stored from (rows and files alike)."""
        if kind == KIND_BYTES:
            return payload
        if kind == KIND_STR:
            return payload.decode("utf-8", "surrogatepass")
        return self._loads(payload)
