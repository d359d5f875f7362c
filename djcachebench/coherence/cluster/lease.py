"""The lease a host holds for strict writes, and the signatures both sides check.

Why apart from ``strict.py``: the subscriber of each host keeps its host's
lease and acknowledges what it applied (:class:`Lease`); the writer reads the
leases and waits for the acknowledgements (``strict.StrictWriter``). The two
sides share only the key names and the keyed BLAKE2b that member values and
acks carry, which are here. The protocol, and why it is enough, is written
once in ``strict.py``'s module doc.

This module imports nothing from Django.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Final

from djcachebench.coherence.cluster.resp import RespConnection
from djcachebench.coherence.table import CHECK_EVERY

__all__ = ["ACK_TTL_MS", "DRIFT", "Lease", "ack_prefix", "mac", "member_prefix", "members_key",
           "verifies"]

#: The share of a lease a host gives up to clock-rate differences: it stops
#: serving L1 hits at ``send + lease * (1 - DRIFT) - CHECK_EVERY``.
DRIFT: Final = 0.1
#: An ack list lives this long past its last push (the writer may have gone).
ACK_TTL_MS: Final = 60_000


def mac(key: bytes, *parts: bytes) -> str:
    """Keyed BLAKE2b over length-prefixed ``parts`` (hex): member values and acks."""
    h = hashlib.blake2b(key=key, digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.hexdigest()


def verifies(keys: Sequence[bytes], signature: bytes, *parts: bytes) -> bool:
    """Does ``signature`` (as :func:`mac` gives it) sign ``parts`` under one of ``keys``?"""
    text = signature.decode("ascii", "replace")
    return any(hmac.compare_digest(text, mac(k, *parts)) for k in keys)


def ack_prefix(base: str) -> str:
    """Every ack key starts so: a subscriber pushes onto no other key."""
    return f"{base}:ack:"


def members_key(base: str) -> str:
    return f"{base}:members"


def member_prefix(base: str) -> str:
    return f"{base}:member:"


class Lease:
    """The subscriber's side: its host's membership, and its acks.

    ``own``: the host's channel id as hex (its name among the members).
    """

    def __init__(self, base: str, own: str, lease: float, key: bytes) -> None:
        self.key_mac = key  # signs this host's member values and acks
        self.members = members_key(base)
        self.key = member_prefix(base) + own
        self.own = own
        self.lease = lease
        self.lease_ms = max(1, int(lease * 1000))
        self.ack_prefix = ack_prefix(base)
        # Serving stops this long after the renewal was sent, before redis
        # drops the key (see ``strict.py``'s module doc).
        self.keep_ns = int((lease * (1 - DRIFT) - CHECK_EVERY) * 1e9)
        self.renew_every_ns = int(lease * 1e9 / 4)

    def value(self, incarnation: int, ready: bool, leaving: bool = False) -> bytes:
        state = b"leaving" if leaving else b"ready" if ready else b"joining"
        inc = str(incarnation).encode()
        return b"%s:%s:%s" % (inc, state, mac(self.key_mac, b"member", self.own.encode(),
                                                inc, state).encode())

    def register(self, conn: RespConnection, incarnation: int, ready: bool,
                 expect: bytes | None = None) -> int:
        """Register (or renew) this host's lease; returns the monotonic ns until
        which the host may serve L1 hits under it. ``expect``: the value this
        subscriber wrote last; finding another (rewritten, or deleted) is a
        fault, raised as ``ValueError``, as are errors."""
        sent = time.monotonic_ns()
        conn.send("SET", self.key, self.value(incarnation, ready), "PX", self.lease_ms, "GET")
        conn.send("SADD", self.members, self.own)
        found = conn.reply()
        conn.reply()
        if expect is not None and found != expect:
            raise ValueError(f"this host's strict-write lease was changed behind it "
                             f"({found!r})")
        return sent + self.keep_ns

    def withdraw(self, conn: RespConnection, incarnation: int) -> None:
        """Say that this incarnation left: its host serves no L1 hit under it any
        more (the caller made sure of that first). Writers that saw this very
        incarnation stop waiting for the host at once instead of waiting out
        its lease (``strict._left``); the value expires like a lease."""
        conn.call("SET", self.key, self.value(incarnation, True, leaving=True),
                  "PX", self.lease_ms, "XX")

    def ack(self, conn: RespConnection, key: str, message: bytes) -> None:
        """Say that this host applied ``message``, which named ``key``."""
        signed = mac(self.key_mac, b"ack", self.own.encode(), key.encode(), message)
        conn.send("RPUSH", key, f"{self.own}:{signed}")
        conn.send("PEXPIRE", key, ACK_TTL_MS)
        conn.reply()
        conn.reply()
