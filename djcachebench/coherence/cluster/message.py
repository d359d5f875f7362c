"""What travels on the channel: one message per batch of stamps of one process.

``[host id, publisher id, seq, enqueued_at_ns, keys]`` as JSON, and a sixth
element, the ack key, on a strict write's message. ``keys`` is a list of final
keys, or ``null`` for "everything" (``clear()``, or a publisher that had to drop
what it could not send). Why each field:

* host id: a host ignores its own messages (its table already has the stamps);
* publisher id and seq: a publisher (one per process) numbers its messages
  1, 2, 3...; a receiver that sees a number skipped knows it lost a message
  and invalidates everything (an epoch bump) instead of staying silently stale;
* enqueued_at_ns (``time.time_ns()`` of the first stamp in the batch): the
  propagation delay, writer's stamp to remote apply. Across real hosts it
  includes their clock offset; on one machine it is exact;
* ack (strict writes only, ``strict.py``): the list every subscriber that applied
  the message pushes its channel id onto, for the writer waiting on it.

JSON: final keys are arbitrary strings, and the encoding must not be able to run
code on the receiver (no pickle).

This module imports nothing from Django.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Message", "decode", "encode"]


@dataclass(frozen=True)
class Message:
    host: int
    publisher: int
    seq: int
    enqueued_at_ns: int
    keys: list[str] | None  # None: every key
    ack: str | None = None  # a strict write's: where to say it was applied


def encode(host: int, publisher: int, seq: int, enqueued_at_ns: int,
           keys: list[str] | None, ack: str | None = None) -> bytes:
    fields: list[object] = [host, publisher, seq, enqueued_at_ns, keys]
    if ack is not None:
        fields.append(ack)
    return json.dumps(fields, separators=(",", ":")).encode()


def decode(data: bytes) -> Message | None:
    """The message, or None when ``data`` is not one (a stranger on the channel)."""
    try:
        fields = json.loads(data)
        host, publisher, seq, at, keys = fields[:5]
        ack = fields[5] if len(fields) == 6 else None
    except Exception:  # anyone who can publish writes here: any parse error
        # Not only ValueError: b"[" * 200000 raises RecursionError in the
        # parser, which would kill the subscriber's thread.
        return None
    if type(fields) is not list or len(fields) not in (5, 6):
        return None
    if ack is not None and type(ack) is not str:
        return None
    if not all(type(x) is int for x in (host, publisher, seq, at)):
        return None
    if keys is not None and (type(keys) is not list or not all(type(k) is str for k in keys)):
        return None
    return Message(host, publisher, seq, at, keys, ack)
