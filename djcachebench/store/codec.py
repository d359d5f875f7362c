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

from ..serializers import RAW_BYTES, RAW_STR, SERIALIZED, TAG_SIZE, Sealer, Serializer

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


# The memo of verified rows (see Codec._open): rows up to this many bytes, at
# most this many of them (so at most ~4 MiB of row bytes per cache instance).
VERIFIED_MAX_BLOB = 1024
VERIFIED_MAX = 4096


class Codec:
    """Encodes values for one cache (one serializer; one integrity key seals, older ones verify)."""

    __slots__ = ("_domains", "_dumps", "_fallbacks", "_kind", "_loads", "_sealer", "_verified")

    def __init__(self, serializer: Serializer, serializer_id: int, sealer: Sealer,
                 fallbacks: Sequence[Sealer] = ()) -> None:
        """``sealer`` seals every value written; a row is also accepted when it
        verifies under one of ``fallbacks`` (older keys, as Django's
        ``SECRET_KEY_FALLBACKS``), so processes on each side of a key rotation
        read each other's values instead of taking them for tampered."""
        self._dumps = serializer.dumps
        self._loads = serializer.loads
        self._kind = serializer_id
        self._sealer = sealer
        self._fallbacks = tuple(fallbacks)
        self._verified: set[tuple[str, bytes, bytes]] = set()
        # The tag domain of each kind of row this codec reads (one place for
        # the mapping; a row of any other kind is not ours to decode).
        self._domains = {serializer_id: SERIALIZED, KIND_BYTES: RAW_BYTES, KIND_STR: RAW_STR}

    def _open(self, key: str, blob: bytes, domain: bytes) -> bytes | None:
        """The payload of a sealed row, or ``None`` when its tag does not verify.

        Why a memo: a cached value is read many times between writes, and the
        tag (BLAKE2b over key and row) is ~0.85 µs of a ~6.5 µs read. A row is
        remembered only after its tag verified, keyed by the key and the row's
        exact bytes (the set compares them in full on a hit), so a row altered
        on disk is different bytes and is verified again; the memo only spares
        re-checking bytes this process has already checked for this key. The
        domain is part of the entry: bytes verified as raw bytes are not
        thereby verified as a pickle.
        """
        verified = self._verified
        if (key, domain, blob) in verified:
            return blob[TAG_SIZE:]
        payload = self._sealer.open(key, blob, domain)
        if payload is None:
            for sealer in self._fallbacks:
                payload = sealer.open(key, blob, domain)
                if payload is not None:
                    break
        if payload is not None and len(blob) <= VERIFIED_MAX_BLOB:
            if len(verified) >= VERIFIED_MAX:
                verified.clear()
            verified.add((key, domain, blob))
        return payload

    def encode(self, key: str, value: Any) -> tuple[int, Any, int]:
        """``(kind, stored value, size in bytes)``. Serializer errors propagate."""
        kind = type(value)
        if kind is int and INT_MIN <= value <= INT_MAX:
            return KIND_INT, value, 8
        if kind is bytes:
            blob = self._sealer.seal(key, value, RAW_BYTES)
            return KIND_BYTES, blob, len(blob)
        if kind is str:
            blob = self._sealer.seal(key, value.encode("utf-8", "surrogatepass"), RAW_STR)
            return KIND_STR, blob, len(blob)
        blob = self._sealer.seal(key, self._dumps(value))
        return self._kind, blob, len(blob)

    def verify(self, key: str, kind: int, stored: Any) -> bool:
        """Would :meth:`decode` accept this row? Checks the tag, decodes nothing."""
        if kind == KIND_INT:
            return type(stored) is int
        domain = self._domains.get(kind)
        return (domain is not None and type(stored) is bytes
                and self._open(key, stored, domain) is not None)

    def decode(self, key: str, kind: int, stored: Any) -> Any:
        """The value, or ``TAMPERED`` if it was altered or written by another codec."""
        if kind == KIND_INT:
            if type(stored) is not int:
                return TAMPERED
            return stored
        domain = self._domains.get(kind)
        if domain is None or type(stored) is not bytes:
            return TAMPERED
        payload = self._open(key, stored, domain)
        if payload is None:
            return TAMPERED
        if kind == KIND_BYTES:
            return payload
        if kind == KIND_STR:
            return payload.decode("utf-8", "surrogatepass")
        return self._loads(payload)
