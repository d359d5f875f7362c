"""Per-process counters, and a rate-limited logger for give-ups and faults.

Why counters and not only logs: diskcache turns a lock timeout into a silent
miss; an operator then sees a hit-rate drop with no cause. Every give-up,
tampered value and fault is counted here and readable from the backend, and
logged at most once per interval per kind so a storm cannot flood the logs.
"""

from __future__ import annotations

import logging
import threading
import time

from ..hoststats.publish import departed

logger = logging.getLogger("djcachebench.sqlite")

COUNTERS = (
    "hits",
    "misses",
    "sets",
    "deletes",
    "lock_waits",  # operations that found a shard busy and had to wait
    "give_ups",  # operations that gave up after the whole retry policy
    "checkpoint_give_ups",  # checkpoints of a large log that readers kept from resetting it
    "tampered",  # values that failed their integrity check (read as misses)
    "culled",  # entries removed by MAX_ENTRIES / SIZE_LIMIT culling
    "expired_removed",  # expired rows swept away
    "errors",  # disk full, I/O errors, read-only files: the operation failed
    "voided",  # keys (or shards, for clear) whose failed write voided their stored rows
    "corruptions",  # shard files found corrupt and quarantined
    "reopened",  # shard files found deleted or replaced under an open connection
    "file_hashes",  # value files whose tag was computed on a read (not vouched for yet)
    "file_vouched",  # value files accepted on an identity another process vouched for
)
#: The host-wide sums of every process's counters, in the cache's directory
#: (``djcachebench.hoststats``).
STATS_FILE = "stats.mmap"


class Stats:
    """Plain integer counters for one process (not shared between processes).

    Increments are not locked: under threads a rare lost increment is an
    acceptable price for not taking a lock on every cache read. The host-wide
    sums read these at each flush (``hoststats/publish.py``), and one last
    time when the object is freed.
    """

    __slots__ = (*COUNTERS, "__weakref__", "_host")

    def __init__(self) -> None:
        self._host = None
        self.reset()

    def __del__(self) -> None:
        departed(self)

    def reset(self) -> None:
        for name in COUNTERS:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}


class RateLimitedLog:
    """Logs one line per event kind per ``interval`` seconds, with a suppressed count."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, level: int, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg += " (%d similar events suppressed)"
            args = (*args, suppressed)
        logger.log(level, msg, *args)


log_event = RateLimitedLog()
__all__ = ["COUNTERS", "STATS_FILE", "RateLimitedLog", "Stats", "log_event", "logger"]
