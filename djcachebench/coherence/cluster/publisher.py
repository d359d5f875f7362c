"""The per-process publisher: this process's stamps, sent to the other hosts.

The table's ``outlet`` is :meth:`Publisher.enqueue`. It is called on every
stamp, so it only appends to a queue; a ``PUBLISH`` there would put a network
round trip inside the write's stamping. :meth:`flush` sends the queue
(one ``PUBLISH`` per batch, on this process's own connection) from the calling
thread: TieredCache calls it after every write, outside any lock, so a write
returns only once its invalidation was handed to redis and the cross-host bound
counts from the acknowledgement (``docs/architecture.md``, Across hosts). Until
some writer has flushed, a daemon thread woken by each stamp sends the queue;
after that it only sweeps, every :data:`BACKSTOP_EVERY`, what no writer flushed
(waking it on every stamp would only make it contend for the GIL and the send
lock with the writer about to send the same queue). The *publication lag*
(stamp to ``PUBLISH`` answered) is measured in :meth:`stats`.

Failures: a batch that cannot be sent is retried on fresh connections for
``give_up_after`` seconds, then dropped; its sequence number is used up anyway,
so every receiver sees the gap on the next message and invalidates everything.
Until a later message gets through, the thread keeps trying to send an
"everything" message, so the gap is told even if this process writes no more.
A queue longer than ``max_queue`` collapses into one "everything" message.

Inline messages: where the L2 is this very redis, a write can carry its own
invalidation in the L2's round trip (``SET`` and ``PUBLISH`` pipelined, redis
applies them in that order: ``djcachebench.tiered.inline``). Such a message is
numbered on a *stream* of its own (:meth:`inline_message`), taken from a pool
for the length of one send, so that the numbers of one stream reach redis in
order although threads send on their own connections; a receiver tracks each
stream as it tracks a publisher. The write then tells the publisher that its key
is covered (:meth:`cover`), and the table's stamp of it queues nothing.

Strict writes (``strict.py``): between :meth:`strict_begin` and
:meth:`strict_end`, this thread's stamps are collected instead of queued, and
sent as one message of their own, on a stream, naming an ack key; the writer
then waits for every live host to apply it.

This module imports nothing from Django.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Final

from djcachebench.coherence.cluster.channels import host_channel
from djcachebench.coherence.cluster.message import encode
from djcachebench.coherence.cluster.resp import RespConnection, ServerAddress
from djcachebench.coherence.cluster.strict import (
    Confirmation,
    StrictWriter,
    StrictWriteUnconfirmed,
    WriteUnconfirmed,
    strict_unverified,
)
from djcachebench.coherence.tokens import tokens

__all__ = ["PublicationDropped", "Publisher"]

log = logging.getLogger("djcachebench.coherence.cluster")

class PublicationDropped(WriteUnconfirmed):
    """A write's L2 write stands, but a message that may carry its invalidation
    was dropped (redis did not take the ``PUBLISH`` for ``give_up_after``): the
    other hosts learn of the gap only at this publisher's next message, so until
    then they may serve the value the write replaced. Raised rather than
    acknowledging such a write: under ``CLIENT PAUSE WRITE``, the usual step
    of a manual failover, the other host's pings keep its L1 serving while
    writes would return without their ``PUBLISH``."""


MAX_BATCH: Final = 512
#: Once writers flush their own stamps, the thread only sweeps this often.
BACKSTOP_EVERY: Final = 0.05
_EVERYTHING: Final = object()


class Publisher:
    """Sends this process's stamps on its host's channel under ``channel``
    (``channels.host_channel``), tagged with ``host_id``."""

    def __init__(self, address: ServerAddress, channel: str, host_id: int,
                 timeout: float = 0.5, give_up_after: float = 2.0,
                 max_queue: int = 100_000, strict: StrictWriter | None = None) -> None:
        self.address = address
        self.strict = strict
        self.channel = host_channel(channel, host_id)
        self.host_id = host_id
        self.timeout = timeout
        self.give_up_after = give_up_after
        self.max_queue = max_queue
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """Fresh state (also in a forked child: threads do not survive a fork)."""
        self.publisher_id = tokens.next()
        self.seq = 0
        self._queue: deque[tuple[object, int]] = deque()
        self._wake = threading.Event()
        self._send_lock = threading.Lock()
        self._conn: RespConnection | None = None
        self._thread: threading.Thread | None = None
        self._owed = False  # a message was dropped: send "everything" when possible
        self._writers_flush = False  # writers call flush() after their writes
        self._streams: deque[list[int]] = deque()  # free inline streams: [id, last seq]
        # .covered: the key this thread published inline; .collect: this thread's
        # stamps during a strict write (None in them: everything), .depth its nesting.
        self._local = threading.local()
        if self.strict is not None:
            self.strict.reset()
        self.strict_writes = 0
        self.strict_hosts_acked = 0
        self.strict_hosts_excluded = 0
        self.strict_unconfirmed = 0
        self.strict_wait_ns = 0
        self.sent_keys = 0
        self.sent_messages = 0
        self.dropped_messages = 0
        self.errors = 0
        self.lag_max_ns = 0
        self.lag_sum_ns = 0

    # --- the outlet (on every stamp: append and wake, nothing else) -----------------

    def enqueue(self, key: str | None) -> None:
        local = self._local
        collect = getattr(local, "collect", None)
        if collect is not None:  # a strict write's: it sends them itself
            collect.append(key)
            return
        if key is not None and key == getattr(local, "covered", None):
            return  # this thread's write published it with the L2 write (see cover())
        self._queue.append((_EVERYTHING if key is None else key, time.time_ns()))
        if self._thread is None:
            self._start()
        if not self._writers_flush:
            self._wake.set()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="djcachebench-cluster-publisher",
                                  daemon=True)
        self._thread = thread
        thread.start()

    # --- sending --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            # Once writers flush their own writes, the thread is a backstop.
            self._wake.wait(BACKSTOP_EVERY if self._owed or self._writers_flush else None)
            self._wake.clear()
            if self._owed:  # the receivers may not have seen the gap yet: say it
                self._owed = False
                self._queue.append((_EVERYTHING, time.time_ns()))
            self.flush()

    def mark(self) -> int:
        """A mark to pass to :meth:`flush`: the count of messages dropped so far."""
        return self.dropped_messages

    def flush(self, since: int | None = None) -> None:
        """Send everything queued so far (from the calling thread). With
        ``since`` (a :meth:`mark` taken before the write), raise
        :class:`PublicationDropped` if any message was dropped meanwhile, by
        this thread or another: it may have carried this write's keys."""
        self._writers_flush = True
        with self._send_lock:
            queue = self._queue
            if len(queue) > self.max_queue:
                first = queue[0][1]
                queue.clear()
                queue.append((_EVERYTHING, first))
            while queue:
                batch: list[str] = []
                everything = False
                first = queue[0][1]
                while queue and len(batch) < MAX_BATCH:
                    key, _ = queue.popleft()
                    if key is _EVERYTHING:
                        everything = True
                    else:
                        batch.append(key)  # type: ignore[arg-type]
                if not self._send(None if everything else batch, first):
                    queue.clear()  # covered by the "everything" now owed
                    break
            if since is not None and self.dropped_messages != since:
                raise PublicationDropped(
                    f"cross-host publish to {self.address.host}:{self.address.port} failed "
                    f"for {self.give_up_after:.1f} s: the write is stored, but other hosts "
                    "may serve the value it replaced until this host's next message reaches "
                    "them")

    def _send(self, keys: list[str] | None, first_ns: int) -> bool:
        self.seq += 1
        payload = encode(self.host_id, self.publisher_id, self.seq, first_ns, keys)
        deadline = time.monotonic() + self.give_up_after
        pause = 0.005
        while True:
            try:
                if self._conn is None:
                    self._conn = RespConnection(self.address, self.timeout)
                self._conn.call("PUBLISH", self.channel, payload)
                break
            except Exception as exc:  # any failure: this connection is done
                self.errors += 1
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if time.monotonic() >= deadline:
                    self.dropped_messages += 1
                    self._owed = True
                    log.warning("cross-host publish to %s:%d failed for %.1f s (%s); message "
                                "#%d dropped: the other hosts will see the gap and "
                                "invalidate everything", self.address.host, self.address.port,
                                self.give_up_after, exc, self.seq)
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
        lag = time.time_ns() - first_ns
        self.lag_sum_ns += lag
        self.lag_max_ns = max(self.lag_max_ns, lag)
        self.sent_messages += 1
        self.sent_keys += len(keys) if keys is not None else 1
        return True

    # --- inline messages (sent by the writer with its L2 write) ----------------------

    def _stream(self) -> list[int]:
        """A free stream ``[id, last seq]`` for one send (a new one if none is free);
        give it back to ``_streams`` once that send is over."""
        try:
            return self._streams.pop()
        except IndexError:
            return [tokens.next(), 0]

    def inline_message(self, key: str) -> tuple[list[int], bytes, int]:
        """A stream, the message for ``key`` on it and when it was made; give the
        stream back with :meth:`inline_done` once redis answered (or the send failed)."""
        stream = self._stream()
        stream[1] += 1
        now = time.time_ns()
        return stream, encode(self.host_id, stream[0], stream[1], now, [key]), now

    def inline_done(self, stream: list[int], sent_at_ns: int | None) -> None:
        """``sent_at_ns``: when the message was made, if redis answered its PUBLISH
        (None: failed; its number is used up, so receivers see the gap on the
        stream's next message, and the key goes through the queue as well)."""
        if sent_at_ns is not None:
            lag = time.time_ns() - sent_at_ns
            self.lag_sum_ns += lag
            self.lag_max_ns = max(self.lag_max_ns, lag)
            self.sent_messages += 1
            self.sent_keys += 1
        self._streams.append(stream)

    def cover(self, key: str | None) -> None:
        """The next stamps of ``key`` by this thread queue nothing (it was
        published inline); ``cover(None)`` ends that once the write is done."""
        self._local.covered = key

    # --- strict writes (strict.py) -----------------------------------------------------

    def strict_begin(self) -> None:
        """Collect this thread's stamps from now on (nested calls: the outermost counts)."""
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if not depth:
            local.collect = []

    def strict_end(self, confirm: bool = True) -> Confirmation | None:
        """Send what this thread stamped since :meth:`strict_begin` as one message
        and wait until every live host applied it. Raises
        :class:`StrictWriteUnconfirmed` when it cannot tell in time (the keys then
        go out as an ordinary message). ``confirm=False``: the write failed; its
        stamps are sent as an ordinary message, nothing is awaited."""
        local = self._local
        local.depth -= 1
        if local.depth:
            return None
        keys: list[str | None] = local.collect
        local.collect = None
        if not keys:
            return None  # nothing changed (a refused add): nothing to wait for
        if not confirm or self.strict is None:
            self._requeue(keys)
            return None
        body = None if None in keys else list(dict.fromkeys(keys))  # type: ignore[arg-type]
        strict = self.strict
        deadline = time.monotonic() + strict.give_up_after
        stream = self._stream()
        made = time.time_ns()
        pause = 0.005
        try:
            while True:
                stream[1] += 1  # a number lost with a failed try is a gap: an epoch bump
                ack = strict.ack_key(stream[0], stream[1])
                message = encode(self.host_id, stream[0], stream[1], made, body, ack)
                try:
                    done = strict.confirm(self.channel, ack, message, deadline)
                    break
                except StrictWriteUnconfirmed:
                    raise
                except Exception as exc:
                    self.errors += 1
                    if time.monotonic() + pause >= deadline:
                        raise StrictWriteUnconfirmed(
                            f"strict write: redis at {self.address.host}:{self.address.port} "
                            f"unusable for {strict.give_up_after:.1f} s ({exc})") from exc
                    time.sleep(pause)
                    pause = min(pause * 2, 0.2)
        except StrictWriteUnconfirmed:
            self.strict_unconfirmed += 1
            self._requeue(keys)
            raise
        finally:
            self._streams.append(stream)
        self.strict_writes += 1
        self.strict_hosts_acked += done.acked
        self.strict_hosts_excluded += done.excluded
        self.strict_wait_ns += done.waited_ns
        self.sent_messages += 1
        self.sent_keys += len(body) if body is not None else 1
        return done

    def _requeue(self, keys: list[str | None]) -> None:
        """Stamps a strict write collected, sent the ordinary way after all (by the
        thread now: no writer of this call flushes them)."""
        for key in keys:
            self.enqueue(key)
        self._wake.set()

    def stats(self) -> dict[str, float | int]:
        n = self.sent_messages
        strict = {} if self.strict is None else {
            "strict_writes": self.strict_writes,
            "strict_hosts_acked": self.strict_hosts_acked,
            "strict_hosts_excluded": self.strict_hosts_excluded,
            "strict_hosts_unverified": strict_unverified(),
            "strict_unconfirmed": self.strict_unconfirmed,
            "strict_wait_ms_mean": (self.strict_wait_ns / self.strict_writes / 1e6
                                    if self.strict_writes else 0.0),
        }
        return {**strict,
            "invalidations_sent": self.sent_keys,
            "messages_sent": n,
            "messages_dropped": self.dropped_messages,
            "publish_errors": self.errors,
            "publish_lag_ms_mean": self.lag_sum_ns / n / 1e6 if n else 0.0,
            "publish_lag_ms_max": self.lag_max_ns / 1e6,
        }
