"""What the parts of the engine share with each other and with the facade.

The miss sentinel, the fault the facade turns into a miss or a failed
write, and the listener the engine tells about every committed change (the
coherence table of TieredCache). Apart from ``shardset.py`` so that the read
path, the write path and the batch operations (``reads.py``, ``writes.py``,
``batch.py``) can name them without importing the shard set that composes
them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

from .retry import CacheUnavailable

# A key with no live, verified value (``get`` and friends).
MISSING: Any = object()


class ShardFault(CacheUnavailable):
    """A shard could not serve an operation (corrupt file, disk full, I/O error)."""


class Listener(Protocol):
    """Told of every change: the coherence stamper of TieredCache
    (``coherence.stamper.EngineStamper``).

    ``changing(key)`` runs inside the write transaction for each row changed
    (a TEMP trigger of each connection calls it, with the key as stored; it
    must never raise). ``committed(keys)`` runs after the commit, for the keys
    the write changed; ``stamp_many(keys)`` for keys a call may have seen
    changed by another process's write (a delete that found nothing).

    ``expires_at`` is the new value's absolute expiry (``math.inf``: never),
    ``None`` for a removal (or unknown), or ``KEEP`` when the write left the
    expiry as it was (``incr``).

    ``watched()`` says whether anybody reads the stamps: while it is false the
    per-key stamps are skipped (they cost a third of a set); it is asked after
    the change committed (see ``GenerationTable.watch`` for why that is safe).
    """

    def watched(self) -> bool: ...

    def changing(self, key: str | bytes) -> None: ...

    def committed(self, keys: Iterable[str], expires_at: Any = None) -> None: ...

    def stamp_many(self, keys: Iterable[str], expires_at: Any = None) -> None: ...

    def stamp_all(self) -> None: ...


def published(expires: float | None) -> float:
    """An engine expiry (``None``: never) as the coherence table publishes it."""
    return math.inf if expires is None else expires
