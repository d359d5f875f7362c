"""The host's one subscriber: remote invalidations in, heartbeat out.

Election: every process that attaches runs a small daemon thread that tries an
exclusive ``flock`` on ``<table>.cluster.lock`` without blocking, every
``elect_every`` seconds. The holder is the subscriber. The kernel drops the lock
when its process dies (``SIGKILL`` included), so another process takes over
within ``elect_every``; a stopped holder keeps it, and its heartbeat goes stale.

The subscriber (``Subscriber.run``), on its own connection:

1. ``PSUBSCRIBE`` to every other host's channel (``channels.py``: the host's
   own messages never reach it) and wait for the server's confirmation of each
   pattern; from then on every message another host publishes reaches this
   connection, in order;
2. bump the table's epoch (``stamp_all_remote``): whatever was published before
   the subscription, the host may have missed, and every L1 entry read before
   now is dropped; entries read after it see every earlier write in the L2;
3. loop: apply messages (``stamp_remote`` of their keys; "everything" or a gap
   in a publisher's numbering: another epoch bump); every ``heartbeat_every``
   send ``PING t0``; when its ``pong`` arrives, every message published before
   the server handled the ping has been applied, so ``fresh_until = t0 +
   stale_after`` is written to the host file (``HostFile.fresh``);
4. any socket error, a reply that does not parse, or no pong for
   :data:`DEAD_AFTER`: mark the host degraded at once, close, reconnect with a
   bounded backoff, and start again at 1. (A pong that is only late, say the
   process was not scheduled, lets freshness lapse but loses nothing: it
   resumes with the next pong, without an epoch bump.)

With strict writes (``strict.py``; the ``Lease`` of ``lease.py``) the
subscriber also holds the host's lease, on a second connection: registered
between 1 and 2 and again after 2, renewed on pongs, and capping
``fresh_until``; it acks every strict message it applied.
A lease it could not renew in time is a fault, as in 4.

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from typing import Final

from djcachebench.coherence.cluster import hostfile as hf
from djcachebench.coherence.cluster.channels import other_hosts_patterns
from djcachebench.coherence.cluster.hostfile import HostFile
from djcachebench.coherence.cluster.lease import Lease
from djcachebench.coherence.cluster.message import decode
from djcachebench.coherence.cluster.resp import RespConnection, RespError, ServerAddress
from djcachebench.coherence.table import CHECK_EVERY, GenerationTable
from djcachebench.coherence.tokens import tokens

__all__ = ["Election", "Subscriber"]

log = logging.getLogger("djcachebench.coherence.cluster")

#: A receiver forgets publishers beyond this many (with an epoch bump: it can no
#: longer tell a gap of a forgotten one).
MAX_PUBLISHERS: Final = 10_000
#: No pong for this long (or 10 x stale_after if longer): the connection is
#: taken for dead, closed and made again (with the epoch bump that follows).
DEAD_AFTER: Final = 2.0


class Subscriber:
    """Applies other hosts' messages to ``table``; keeps ``host``'s heartbeat.

    ``channel`` is the base name: each host publishes on its own channel under
    it (``channels.host_channel``)."""

    def __init__(self, address: ServerAddress, channel: str, table: GenerationTable,
                 host: HostFile, heartbeat_every: float, stale_after: float,
                 lease: Lease | None = None) -> None:
        self.address = address
        self.lease = lease
        self.patterns = other_hosts_patterns(channel, host.host_id)
        self.table = table
        self.host = host
        self.heartbeat_every = heartbeat_every
        self.stale_after = stale_after
        self.stopping = threading.Event()
        self.failing = False  # in an outage (logged once)
        # Connecting, SUBSCRIBE and the rest of a reply already begun: a slow
        # answer is not a lost message, so only a dead connection's wait.
        self.io_timeout = max(DEAD_AFTER, 10 * stale_after)

    def run(self) -> None:
        """Until :attr:`stopping` is set: subscribe, apply, heartbeat; reconnect on errors."""
        pause = 0.01
        self.failing = False
        while not self.stopping.is_set():
            conn = acker = None
            try:
                conn = RespConnection(self.address, self.io_timeout)
                if self.lease is not None:
                    acker = RespConnection(self.address, self.io_timeout)
                self._serve(conn, acker)
                pause = 0.01
            except (OSError, RespError, ValueError, IndexError) as exc:
                self.host.degrade()
                if not self.failing:  # once per outage, not once per retry
                    log.warning("cross-host subscriber (pid %d) lost %s:%d (%s); L1 hits stop "
                                "on this host until it has resynchronised", os.getpid(),
                                self.address.host, self.address.port, exc)
                self.failing = True
            except Exception:
                # Anything else (a reply of a shape nobody expected): the same
                # as a lost connection. Letting it end the thread left the host
                # without a subscriber, its L1 hits off for good.
                self.host.degrade()
                log.exception("cross-host subscriber (pid %d) failed; reconnecting, L1 hits "
                              "stop on this host until it has resynchronised", os.getpid())
                self.failing = True
            finally:
                for c in (conn, acker):
                    if c is not None:
                        c.close()
            self.stopping.wait(pause)
            pause = min(pause * 2, 0.2)
        self.host.degrade()

    def _serve(self, conn: RespConnection, acker: RespConnection | None) -> None:
        host, table, lease = self.host, self.table, self.lease
        conn.send("PSUBSCRIBE", *self.patterns)
        for _ in self.patterns:  # one confirmation per pattern, in order
            reply = conn.reply()
            if not (isinstance(reply, list) and reply[0] == b"psubscribe"):
                raise ValueError(f"unexpected answer to PSUBSCRIBE: {reply!r}")
        # Subscribed: everything published from now on reaches us. A strict
        # writer that reads the members from now on waits for this host
        # (strict.py: registered before the epoch bump, ready after it).
        incarnation = tokens.next()
        lease_until = 0
        if lease is not None:
            lease.register(acker, incarnation, ready=False)  # type: ignore[arg-type]
        # What came before, this host may have missed.
        table.stamp_all_remote()
        if lease is not None:
            lease_until = lease.register(acker, incarnation, ready=True,  # type: ignore[arg-type]
                                         expect=lease.value(incarnation, False))
            ours = lease.value(incarnation, True)
            renew_at = time.monotonic_ns() + lease.renew_every_ns
        host.add(hf.EPOCH_BUMPS)
        host.add(hf.CONNECTS)
        if self.failing:
            log.warning("cross-host subscriber (pid %d) resubscribed to %s:%d and "
                        "invalidated every L1 entry of the host", os.getpid(),
                        self.address.host, self.address.port)
            self.failing = False
        seqs: dict[int, int] = {}
        my_host = host.host_id
        own_prefix = b"[%d," % my_host  # how this host's messages begin
        stale_ns = int(self.stale_after * 1e9)
        # A late pong is not a lost message (one connection delivers in order):
        # freshness lapses at stale_after, but the connection is given up (and
        # the host's L1 entries with it) only when it looks dead.
        dead_ns = int(self.io_timeout * 1e9)
        every_ns = int(self.heartbeat_every * 1e9)
        next_ping = 0
        last_pong = time.monotonic_ns()
        while not self.stopping.is_set():
            now = time.monotonic_ns()
            if now >= next_ping:
                conn.send("PING", str(now))
                next_ping = now + every_ns
            if now - last_pong > dead_ns:
                raise TimeoutError(f"no pong for {dead_ns / 1e9:g} s")
            if lease is not None:
                if now >= lease_until:  # not renewed in time: writers may skip us
                    raise TimeoutError("the host's strict-write lease ran out")
                if now >= renew_at:
                    lease_until = lease.register(acker, incarnation,  # type: ignore[arg-type]
                                                 ready=True, expect=ours)
                    renew_at = now + lease.renew_every_ns
            if not conn.buffered():
                conn.settimeout(max(0.0005, (next_ping - now) / 1e9))
                try:
                    conn.fill()
                except TimeoutError:
                    continue
            conn.settimeout(self.io_timeout)  # the rest of a reply already begun
            while True:
                item = conn.reply()
                kind = item[0]
                if kind == b"pmessage":  # pattern, channel, data
                    self._apply(item[3], seqs, my_host, own_prefix, acker)
                elif kind == b"pong":
                    t0 = int(item[1])
                    last_pong = time.monotonic_ns()
                    until = t0 + stale_ns
                    host.fresh(until if lease is None else min(until, lease_until))
                if not conn.buffered():
                    break
        if lease is not None:
            self._withdraw(acker, incarnation)  # type: ignore[arg-type]

    def _withdraw(self, acker: RespConnection, incarnation: int) -> None:
        """A clean stop: give the lease back, so that strict writers need not
        wait it out (a host whose processes all exit would stall them up to one
        lease). First the host stops serving L1 hits: every process of it asks
        the guard again within ``CHECK_EVERY`` (``TableFile.check``), so once
        that has passed since the heartbeat was cleared, none serves under this
        incarnation any more, and saying so is true."""
        self.host.degrade()
        time.sleep(CHECK_EVERY * 1.5)
        try:
            self.lease.withdraw(acker, incarnation)  # type: ignore[union-attr]
        except (OSError, RespError) as exc:  # it will expire instead
            log.info("could not give back the strict-write lease (%s); it expires", exc)

    def _apply(self, data: bytes, seqs: dict[int, int], my_host: int,
               own_prefix: bytes, acker: RespConnection | None) -> None:
        host, table = self.host, self.table
        if data.startswith(own_prefix):
            # Our own host's stamps, already in the table (not even decoded). The
            # patterns keep them out; counted, since one here means they did not.
            host.add(hf.ECHOES)
            return
        msg = decode(data)
        if msg is None:  # not ours to read: we cannot tell what it invalidates
            table.stamp_all_remote()
            host.add(hf.EPOCH_BUMPS)
            return
        if msg.host == my_host:
            host.add(hf.ECHOES)
            return  # our own stamps, already in the table
        last = seqs.get(msg.publisher)
        if last is not None and msg.seq != last + 1 and msg.seq != last:
            table.stamp_all_remote()  # lost messages: invalidate all that may be stale
            host.add(hf.GAPS)
            host.add(hf.EPOCH_BUMPS)
        if len(seqs) >= MAX_PUBLISHERS and msg.publisher not in seqs:
            seqs.clear()
            table.stamp_all_remote()
            host.add(hf.EPOCH_BUMPS)
        seqs[msg.publisher] = max(msg.seq, last or 0)
        if msg.keys is None:
            table.stamp_all_remote()
            host.add(hf.EPOCH_BUMPS)
            host.add(hf.APPLIED_KEYS)
        else:
            table.stamp_remote(msg.keys)
            host.add(hf.APPLIED_KEYS, len(msg.keys))
        host.add(hf.MESSAGES)
        host.record_delay(time.time_ns() - msg.enqueued_at_ns)
        # Applied: say so to the strict writer (only onto an ack key: a
        # stranger on the channel cannot make us push onto another list).
        lease = self.lease
        if (msg.ack is not None and acker is not None and lease is not None
                and msg.ack.startswith(lease.ack_prefix) and len(msg.ack) <= 200):
            lease.ack(acker, msg.ack, data)
            host.add(hf.ACKS)


class Election:
    """This process's candidacy for the host's subscriber (a daemon thread)."""

    def __init__(self, lock_path: str, subscriber: Subscriber, elect_every: float) -> None:
        self.lock_path = lock_path
        self.subscriber = subscriber
        self.elect_every = elect_every
        self.elected = False
        self._fd = -1
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="djcachebench-cluster-election",
                                            daemon=True)
            self._thread.start()

    def _after_fork(self) -> None:
        # The child inherits the descriptor of the parent's flock: if it kept it,
        # the lock would outlive the parent and nobody would subscribe. It holds
        # no thread either: it stands again.
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1
        self.elected = False
        self._thread = None
        if self.subscriber.stopping.is_set():
            return  # left the election (stop()) before the fork: stays out
        self.subscriber.stopping = threading.Event()
        self.start()

    def _run(self) -> None:
        while not self.subscriber.stopping.is_set():
            if self._try_lock():
                self.elected = True
                host = self.subscriber.host
                host.add(hf.TAKEOVERS)
                host.put(hf.SUBSCRIBER_PID, os.getpid())
                log.info("pid %d is now the cross-host subscriber of %s", os.getpid(),
                         self.lock_path)
                try:
                    self.subscriber.run()
                except Exception:  # stand again rather than leave no subscriber
                    self.subscriber.host.degrade()
                    log.exception("cross-host subscriber (pid %d) stopped on an error; "
                                  "standing again", os.getpid())
                finally:
                    self.elected = False
                    self._release()
                if self.subscriber.stopping.is_set():
                    return
            self.subscriber.stopping.wait(self.elect_every)

    def _try_lock(self) -> bool:
        try:
            if self._fd < 0:
                self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def _release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def stop(self, timeout: float = 2.0) -> None:
        self.subscriber.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
