"""Value serializers, chosen by short name or dotted path, and the integrity tag.

Why the tag: a disk cache that unpickles whatever is in its files turns write
access to the cache directory into code execution (diskcache has an open CVE
for exactly that). Every serialized value is stored behind a keyed BLAKE2b tag
over the cache key and the payload; a value whose tag does not verify is never
handed to the serializer, and the caller sees a miss. Binding the cache key
into the tag also stops a valid value from being copied to another key.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import pickle
from typing import Any, Protocol, runtime_checkable

TAG_SIZE = 16
# A row's payload of at least this many bytes is tagged like a file's
# (HMAC-SHA256), a shorter one with BLAKE2b: see Sealer.
SHA_MIN = 4096
# Tag domains: how a sealed payload is read (see Sealer.tag). A serialized
# payload's domain also names its serializer (``serialized_domain``): this
# first byte, then 8 bytes of a hash of its name.
SERIALIZED = b"\x00"
RAW_BYTES = b"\x01"
RAW_STR = b"\x02"
RAW_INT = b"\x03"
# Domain separation: the tag key is derived from SECRET_KEY, never SECRET_KEY itself.
_KEY_CONTEXT = b"djcachebench.integrity.v1"


@runtime_checkable
class Serializer(Protocol):
    """What a ``SERIALIZER`` must provide: ``dumps`` to bytes and ``loads`` back."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class PickleSerializer:
    """The default: any picklable Python object, highest protocol."""

    protocol = pickle.HIGHEST_PROTOCOL

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, self.protocol)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class MsgpackSerializer:
    """msgpack: smaller and never executes code, but only plain data types.

    Tuples come back as lists (msgpack has one array type), except as dict
    keys, where they come back as tuples (a list cannot be a key); ``use_bin_type``
    keeps ``bytes`` and ``str`` apart.
    """

    def __init__(self) -> None:
        import msgpack  # imported here: an optional extra

        self._packb = msgpack.packb
        self._unpackb = msgpack.unpackb

    def dumps(self, value: Any) -> bytes:
        return self._packb(value, use_bin_type=True)

    def loads(self, data: bytes) -> Any:
        try:
            return self._unpackb(data, raw=False, strict_map_key=False)
        except TypeError:
            # A dict with a tuple key: packed as an array, it came back as an
            # unhashable list. Read again with keys made tuples (a key can
            # never have been a list), rather than fail to read what set took
            # (the value would be lost, and the key blocked for add until it
            # expired). Only then: the hook costs a Python call per dict.
            return self._unpackb(data, raw=False, strict_map_key=False,
                                 object_pairs_hook=_keyed_by_tuples)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(part) for part in key) if type(key) is list else key


def _keyed_by_tuples(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    return {_hashable(key): value for key, value in pairs}


SHORT_NAMES: dict[str, str] = {
    "pickle": "djcachebench.serializers.PickleSerializer",
    "msgpack": "djcachebench.serializers.MsgpackSerializer",
}


def load_serializer(name: str) -> Serializer:
    """Instantiate the serializer named by a short name or a dotted path.

    Raises ``ImportError`` or ``TypeError`` with the reason; the caller turns
    that into ``ImproperlyConfigured`` naming the setting.
    """
    path = SHORT_NAMES.get(name, name)
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ImportError(f"{name!r} is neither a short name nor a dotted path")
    cls = getattr(importlib.import_module(module_name), attr)
    instance = cls()
    if not all(callable(getattr(instance, name, None)) for name in ("dumps", "loads")):
        raise TypeError(f"{path} has no dumps()/loads() methods")
    return instance


def serialized_domain(name: str) -> bytes:
    """The tag domain of payloads made by the serializer ``name`` (its
    ``SERIALIZER`` setting: ``"pickle"``, ``"msgpack"`` or a dotted path).

    Why the name is in it: the row's ``kind`` column says which serializer
    wrote a row, but the tag does not cover that column, and custom
    serializers share one kind. Without it, bytes one serializer made from a
    visitor's data (msgpack of a dict of strings) and sealed, relabelled as
    another's (pickle), verified and were handed to that one's ``loads``.
    Fixed length (9 bytes), and the raw domains are single bytes other than
    ``SERIALIZED``: no domain is a prefix of another.
    """
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8,
                             person=b"djcb-serializer").digest()
    return SERIALIZED + digest


def derive_tag_key(secret: bytes, context: bytes = _KEY_CONTEXT) -> bytes:
    """A 32-byte BLAKE2b key derived from ``secret`` (SECRET_KEY or OPTIONS) for
    one use (``context``: rows' tags by default), never ``secret`` itself."""
    return hashlib.blake2b(secret, key=context, digest_size=32).digest()


class Sealer:
    """Prefixes payloads with a keyed tag and checks it before anything is decoded.

    Two tags, by length. Payloads under ``SHA_MIN`` bytes (most rows) carry
    BLAKE2b, cheapest on short inputs and mostly skipped on reads by the
    codec's memo. Longer ones (long rows, and every value stored in a file,
    see ``store/values.py``) carry HMAC-SHA256 truncated to ``TAG_SIZE``:
    with the SHA extensions of current x86 and ARM cores OpenSSL's SHA-256
    hashes in about half of BLAKE2b's time from a few kilobytes up
    (docs/benchmarks.md), and a row of 10 KB read
    at random among many is verified on every read (the memo cannot hold
    them all). Both bind the cache key and the domain. A long row sealed with
    BLAKE2b (format 4, before the switch) still verifies: it is tried when
    HMAC-SHA256 does not, so only a forged row pays both.
    """

    __slots__ = ("_keyed", "_keyed_large")

    def __init__(self, tag_key: bytes) -> None:
        # Keying BLAKE2b costs a compression of the key block; copying a
        # pre-keyed state skips it (a third of the tag's cost on small values).
        self._keyed = hashlib.blake2b(key=tag_key, digest_size=TAG_SIZE)
        self._keyed_large = hmac.new(tag_key, digestmod="sha256")

    def tag_large(self, cache_key: str, payload: bytes | memoryview, domain: bytes) -> bytes:
        """HMAC-SHA256 over ``len(key) || cache key || domain || payload`` (first
        TAG_SIZE bytes). The length makes the split between key and payload
        unambiguous, so no (key, payload) pair can borrow another's tag.

        The payload is fed as it is, never concatenated: on a large value a
        copy costs as much as a read from the page cache.
        """
        h = self._keyed_large.copy()
        raw_key = cache_key.encode("utf-8", "surrogatepass")
        h.update(b"%s%s%s" % (len(raw_key).to_bytes(4, "big"), raw_key, domain))
        h.update(payload)
        return h.digest()[:TAG_SIZE]

    def check_large(self, cache_key: str, payload: bytes, domain: bytes, tag: bytes) -> bool:
        """Does ``tag`` verify ``payload`` under this key (constant-time compare)?"""
        return hmac.compare_digest(tag, self.tag_large(cache_key, payload, domain))

    def tag(self, cache_key: str, payload: bytes, domain: bytes = SERIALIZED) -> bytes:
        """BLAKE2b over ``len(key) || cache key || domain || payload``.

        ``domain`` says how the payload is to be read: serialized (and by
        which serializer, :func:`serialized_domain`), or raw ``bytes``/``str``/
        ``int``. It is what stops a row being relabelled: raw bytes (which may
        be anyone's data) relabelled as a pickle no longer verify.

        The key's length makes the split between key and the rest unambiguous.
        Without it, a key that ends like a domain byte and a payload (a key
        holding ``"\x00"`` and a pickle's bytes, stored with an empty value)
        had the same tag input as a shorter key's pickle, and a row planted
        under the shorter key with that tag was unpickled.
        """
        h = self._keyed.copy()
        raw_key = cache_key.encode("utf-8", "surrogatepass")
        # One update instead of several: cheaper on a cache-sized value.
        h.update(b"%s%s%s%s" % (len(raw_key).to_bytes(4, "big"), raw_key, domain, payload))
        return h.digest()

    def seal(self, cache_key: str, payload: bytes, domain: bytes = SERIALIZED) -> bytes:
        if len(payload) >= SHA_MIN:
            return self.tag_large(cache_key, payload, domain) + payload
        # tag(), inlined: every write of a short value comes through here.
        h = self._keyed.copy()
        raw_key = cache_key.encode("utf-8", "surrogatepass")
        h.update(b"%s%s%s%s" % (len(raw_key).to_bytes(4, "big"), raw_key, domain, payload))
        return h.digest() + payload

    def open(self, cache_key: str, blob: bytes, domain: bytes = SERIALIZED) -> bytes | None:
        """The payload, or ``None`` when the tag does not verify (tampered or foreign)."""
        if len(blob) < TAG_SIZE:
            return None
        payload = blob[TAG_SIZE:]
        tag = blob[:TAG_SIZE]
        if len(payload) >= SHA_MIN and hmac.compare_digest(
            tag, self.tag_large(cache_key, payload, domain)
        ):
            return payload
        if not hmac.compare_digest(tag, self.tag(cache_key, payload, domain)):
            return None
        return payload
