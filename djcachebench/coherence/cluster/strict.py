"""Strict writes across hosts: a write returns once every live host applied it.

Why: the cluster's ordinary guarantee has a bound (a read that starts on another
host more than ``STALE_AFTER + CHECK_EVERY`` after a write's acknowledgement
never returns the older value). Some writes cannot live with even that window:
a permission revoked, a price changed at a given instant. A strict write makes
the window zero for every host that takes part, at the cost of waiting for them.

**Membership.** Every host's subscriber holds a *lease* in redis: the key
``<base>:member:<channel id hex>``, set with ``PX lease`` and renewed while its
subscription is healthy, and the id in the set ``<base>:members``. The value is
``<incarnation>:joining`` or ``<incarnation>:ready``; a new incarnation is drawn
at every (re)subscription. The order on each subscription is:

1. ``PSUBSCRIBE`` confirmed (every later message reaches the host);
2. register ``<incarnation>:joining``;
3. bump the table's epoch (every L1 entry read before now is dropped);
4. register ``<incarnation>:ready``; from then on renew it, and apply messages.

The host serves L1 hits only while its lease, as it counts it on its own clock,
has not run out: ``fresh_until`` is capped at the renewal's send time plus
``lease * (1 - DRIFT)`` less the guard's ``CHECK_EVERY``, which is before redis
lets the key expire (redis starts the ``PX`` when it handles the command, after
the send). A lease the subscriber could not renew in time is a fault: it
reconnects, which is a new incarnation and a new epoch.

**The write.** After its L2 write, a strict writer sends, in one pipeline on a
connection of its own, ``EVAL`` of :data:`LIVE_MEMBERS` (the hosts whose lease is
live, with their values) and the ``PUBLISH`` of its keys with an *ack key*
(``<base>:ack:<stream>:<seq>``). Every subscriber that applies the message
pushes its channel id onto that list (``RPUSH``, then ``PEXPIRE``). The writer
``BLPOP``s it until every host it read (its own excepted) is *done*:

* it acked: its table holds the stamp, so no entry of the key read before the
  stamp is current there;
* its lease is gone: it stopped serving L1 hits before that (above);
* it shows a ``ready`` incarnation other than the one the writer read: it
  resubscribed since, and bumped its epoch after registering, hence after the
  writer's read, hence after the writer's L2 write.

A host that was not in the writer's read registered after it, so its epoch bump
(step 3) came after the writer's L2 write: every entry it serves was read after
that write. Members are read *before* the ``PUBLISH`` so that a host in the read
had its subscription confirmed before the message went out, and will receive it.

**Trust.** Whoever can ``PUBLISH`` on the redis, or write its keys, could
otherwise make a writer stop waiting for a host that has not applied its write:
by pushing that host's id onto the ack key, by a message of their own naming it
(the host would apply it and ack), or by rewriting or deleting its member key.
So member values and acks carry a keyed BLAKE2b under a key derived from
``SECRET_KEY`` (and its fallbacks, to verify): an ack counts only if it names
this very message's bytes, a member value only if it verifies. A member whose
key vanishes or stops verifying is waited for until its last seen lease would
have ended (``PTTL``, plus the drift margin), and every writer process
remembers the hosts it has seen for as long: deleting a key cannot cut a wait
short. The subscriber renews with ``SET ... GET`` and treats a value it did not
write as a fault (resubscribe: a new incarnation and an epoch bump). What is
left to a party with write access to the redis: hiding a host from a writer
process that has never seen it, during the quarter lease before that host's
next renewal; the ordinary bound still holds then (docs/architecture.md).

When the writer cannot finish (redis unreachable from it, a host that renews its
lease but never acks) it gives up after ``give_up_after`` and raises
:class:`StrictWriteUnconfirmed`: the L2 write stands, but its acknowledgement
to the caller would be a lie. Its keys then go out as an ordinary message.

Limits (docs/architecture.md, Strict writes): leases count on the redis
server's wall clock; a forward step of that clock larger than the margin can
expire a lease early. A host that leaves (every process gone) stalls strict
writes for up to one lease. Hosts without ``STRICT_LEASE`` hold no lease and
keep the ordinary bound.

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

from djcachebench.coherence.cluster.lease import (
    ACK_TTL_MS,
    DRIFT,
    ack_prefix,
    member_prefix,
    members_key,
    verifies,
)
from djcachebench.coherence.cluster.resp import RespConnection, ServerAddress

__all__ = ["FLUSH_KEEPING_MEMBERS", "LIVE_MEMBERS", "Confirmation", "StrictWriteUnconfirmed",
           "StrictWriter", "WriteUnconfirmed", "strict_unverified"]

log = logging.getLogger("djcachebench.coherence.cluster")

#: The hosts whose lease is live: ``[id, value, pttl, id, value, pttl, ...]``;
#: ids whose lease expired are dropped from the set on the way. KEYS[1] the
#: set, ARGV[1] the members' key prefix.
LIVE_MEMBERS: Final = """
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. id
  local value = redis.call('GET', key)
  if value then
    out[#out + 1] = id
    out[#out + 1] = value
    out[#out + 1] = redis.call('PTTL', key)
  else
    redis.call('SREM', KEYS[1], id)
  end
end
return out
"""

#: ``FLUSHDB`` of the members' database with every live lease and every ack list
#: kept, in one script (nothing runs in between): what clearing an L2 that
#: shares that database does under strict writes. KEYS[1] the set, ARGV[1] the
#: members' key prefix, ARGV[2] a ``KEYS`` pattern of the ack lists, ARGV[3] the
#: life (ms) of an ack list caught between its ``RPUSH`` and ``PEXPIRE``.
#: Returns how many leases it kept. ``KEYS`` walks the database once, as the
#: ``FLUSHDB`` beside it does.
FLUSH_KEEPING_MEMBERS: Final = """
local kept = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. id
  local value = redis.call('GET', key)
  local ttl = redis.call('PTTL', key)
  if value and ttl > 0 then
    kept[#kept + 1] = {key, value, ttl, id}
  end
end
local acks = {}
for _, key in ipairs(redis.call('KEYS', ARGV[2])) do
  if redis.call('TYPE', key).ok == 'list' then
    local ttl = redis.call('PTTL', key)
    if ttl == -1 then ttl = tonumber(ARGV[3]) end
    if ttl > 0 then
      acks[#acks + 1] = {key, redis.call('LRANGE', key, 0, -1), ttl}
    end
  end
end
redis.call('FLUSHDB')
for _, m in ipairs(kept) do
  redis.call('SET', m[1], m[2], 'PX', m[3])
  redis.call('SADD', KEYS[1], m[4])
end
for _, a in ipairs(acks) do
  for _, v in ipairs(a[2]) do
    redis.call('RPUSH', a[1], v)
  end
  redis.call('PEXPIRE', a[1], a[3])
end
return #kept
"""


def _glob_escaped(text: str) -> str:
    """``text`` as a literal in a ``KEYS``/``SCAN`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class WriteUnconfirmed(Exception):
    """A write's L2 write stands, but its invalidation was not seen to reach the
    other hosts in time: acknowledging it would break the cross-host guarantee
    (docs/architecture.md, Across hosts). Base of the two cases below."""


class StrictWriteUnconfirmed(WriteUnconfirmed):
    """A strict write's L2 write stands, but not every live host was seen to
    apply it within the time allowed: its acknowledgement would not hold."""


class Confirmation:
    """What one strict write waited for, for its caller's counters."""

    __slots__ = ("acked", "excluded", "hosts", "waited_ns")

    def __init__(self) -> None:
        self.hosts = 0  # other hosts the write had to hear from
        self.acked = 0
        self.excluded = 0  # lease gone, or resubscribed since
        self.waited_ns = 0


class _Member:
    """One host as a listing showed it: its incarnation (None if its value did
    not verify), whether it was ready, and whether that incarnation left."""

    __slots__ = ("incarnation", "leaving", "ready")

    def __init__(self, incarnation: bytes | None, ready: bool, leaving: bool = False) -> None:
        self.incarnation = incarnation
        self.ready = ready
        self.leaving = leaving


def _members(reply: list, keys: Sequence[bytes], now: float, known: dict[str, float],
             seen: dict[str, bytes]) -> dict[str, _Member]:
    """The listed hosts whose value verifies; ``known`` learns until when each
    live one's lease may still run (monotonic seconds, with the drift margin),
    ``seen`` the incarnation each showed live last."""
    out = {}
    for i in range(0, len(reply), 3):
        host = reply[i].decode("ascii", "replace")
        parts = reply[i + 1].split(b":")
        if (len(parts) != 3 or parts[1] not in (b"ready", b"joining", b"leaving")
                or not verifies(keys, parts[2], b"member", host.encode(), parts[0], parts[1])):
            _unverified(host)
            continue  # not a host's own value: it proves nothing
        out[host] = _Member(parts[0], parts[1] == b"ready", parts[1] == b"leaving")
        if parts[1] == b"leaving":
            continue  # a lease given back: nothing to remember it by
        seen[host] = parts[0]
        ttl = reply[i + 2] / 1000 if reply[i + 2] > 0 else 0.0
        known[host] = max(known.get(host, 0.0), now + ttl * (1 + DRIFT) + 0.001)
    return out


#: Listed hosts whose lease did not verify, and when one was last logged.
_UNVERIFIED = {"count": 0, "logged_at": -math.inf}


def _unverified(host: str) -> None:
    """Count, and log at most once a minute, a member whose lease does not verify:
    strict writes do not wait for it, and the likeliest cause is a host with
    another ``SECRET_KEY``, which then serves values strict writes replaced
    without anything else saying so."""
    _UNVERIFIED["count"] += 1
    now = time.monotonic()
    if now - _UNVERIFIED["logged_at"] >= 60.0:
        _UNVERIFIED["logged_at"] = now
        log.error("strict writes: host %s holds a lease this process cannot verify (another "
                  "SECRET_KEY, not in SECRET_KEY_FALLBACKS here?): they do not wait for it, "
                  "and its L1s may serve values they replaced", host)


def strict_unverified() -> int:
    """How many listed leases this process could not verify (``_unverified``)."""
    return int(_UNVERIFIED["count"])


def _left(current: _Member | None, seen: bytes | None) -> bool:
    """Did the host leave, as far as this writer process can trust it? A signed
    ``leaving`` counts only for the incarnation this process last saw live (or
    for a host it never saw, whose key could as well have been deleted): an old
    incarnation's ``leaving``, put back by whoever can write the redis, must not
    end the wait for a newer one that serves."""
    return (current is not None and current.leaving
            and (seen is None or seen == current.incarnation))


def _done(start: _Member | None, current: _Member | None, now: float, until: float,
          seen: bytes | None = None, remembered: bytes | None = None) -> bool:
    """Is a host that showed ``start`` when the write listed the members (None:
    not listed, only remembered, with the incarnation ``remembered``), and
    ``current`` now (None: gone, or no longer verifying), no longer one to wait
    for? ``seen``: the incarnation this process last saw it live with.

    A live host is done once it is ready under an incarnation other than the
    one it had when the write began: it resubscribed since, and bumped its
    epoch before it served again. That holds for a host only remembered too (a
    redis restarted without persistence lists no host until each registers
    again): waiting for it there, with no ack to come from the new
    incarnation, would hold the write to its deadline and raise."""
    if current is not None and current.leaving:
        # Its subscriber stopped its host's L1 hits before it said so.
        return _left(current, seen) or now >= until
    if current is not None:  # a live, verified lease
        was = start.incarnation if start is not None else remembered
        return current.ready and was is not None and current.incarnation != was
    return now >= until  # gone: only once its last seen lease would have ended


class StrictWriter:
    """The writer's side: publish one message and wait for the live hosts' acks.

    Connections come from a small pool (a wait holds one for its length, so
    threads do not queue behind each other's waits)."""

    def __init__(self, address: ServerAddress, base: str, own: str, lease: float,
                 keys: Sequence[bytes], timeout: float = 0.5) -> None:
        self.address = address
        self.keys = tuple(keys)  # that verify hosts' member values and acks
        # Hosts seen live, until when their lease may run, and the incarnation
        # each showed last (see _members).
        self.known: dict[str, float] = {}
        self.seen: dict[str, bytes] = {}
        self.members = members_key(base)
        self.member_prefix = member_prefix(base)
        self.ack_prefix = ack_prefix(base)
        self.own = own
        self.lease = lease
        self.timeout = timeout
        # Never wait past this: a live host's lease ends within one lease of
        # its last renewal, so only a host that renews without acking, or a
        # redis this process cannot reach, gets here.
        self.give_up_after = 2 * lease + 1.0
        # How often the members are read again while waiting.
        self.recheck = min(max(lease / 10, 0.01), 0.1)
        self._pool: deque[RespConnection] = deque()

    def reset(self) -> None:
        """Forget the pooled connections (a forked child must not share them)."""
        self._pool = deque()

    def ack_key(self, stream: int, seq: int) -> str:
        """A fresh ack key (random: nobody can name the next one in advance)."""
        return f"{self.ack_prefix}{stream}:{seq}:{secrets.token_hex(8)}"

    def confirm(self, channel: bytes, ack: str, message: bytes,
                deadline: float) -> Confirmation:
        """Read the live hosts, ``PUBLISH`` ``message`` (which names ``ack``) on
        ``channel``, and wait until every host read is done. Raises ``OSError``,
        ``RespError`` (the caller retries with a new message until its deadline)
        or :class:`StrictWriteUnconfirmed` at ``deadline`` (monotonic seconds)."""
        began = time.monotonic_ns()
        conn = self._connection()
        try:
            conn.send("EVAL", LIVE_MEMBERS, 1, self.members, self.member_prefix)
            conn.send("PUBLISH", channel, message)
            known, seen = self.known, self.seen
            now = time.monotonic()
            start: dict[str, _Member | None] = dict(
                _members(conn.reply(), self.keys, now, known, seen))
            conn.reply()
            for host, until in list(known.items()):  # seen by this process lately
                if until <= now:
                    del known[host]
                elif host not in start:
                    start[host] = None
            start.pop(self.own, None)
            remembered = {h: seen.get(h) for h, m in start.items() if m is None}
            done = Confirmation()
            done.hosts = len(start)
            waiting = set(start)
            left = {h for h in waiting if _left(start[h], seen.get(h))}
            self._forget(left)
            done.excluded += len(left)
            waiting -= left
            next_read = time.monotonic() + self.recheck
            while waiting:
                now = time.monotonic()
                if now >= deadline:
                    raise StrictWriteUnconfirmed(
                        f"{len(waiting)} host(s) neither applied a strict write nor let "
                        f"their lease expire in time: {sorted(waiting)}")
                if now >= next_read:
                    current = _members(conn.call("EVAL", LIVE_MEMBERS, 1, self.members,
                                                 self.member_prefix), self.keys, now, known,
                                       seen)
                    gone = {h for h in waiting
                            if _done(start[h], current.get(h), now, known.get(h, 0.0),
                                     seen.get(h), remembered.get(h))}
                    self._forget(h for h in gone if _left(current.get(h), seen.get(h)))
                    done.excluded += len(gone)
                    waiting -= gone
                    next_read = time.monotonic() + self.recheck
                    continue
                wait = max(0.01, min(next_read, deadline) - now)
                conn.settimeout(wait + self.timeout)
                popped = conn.call("BLPOP", ack, f"{wait:.3f}")
                if popped is not None:
                    host, _, mac = popped[1].partition(b":")
                    name = host.decode("ascii", "replace")
                    if name in waiting and verifies(self.keys, mac, b"ack", host,
                                                     ack.encode(), message):
                        waiting.discard(name)
                        done.acked += 1
            done.waited_ns = time.monotonic_ns() - began
        except BaseException:
            conn.close()
            raise
        self._pool.append(conn)
        return done

    def _connection(self) -> RespConnection:
        """A pooled connection (a new one if none is free), its timeout reset;
        the caller puts it back when done, or closes it on an error."""
        try:
            conn = self._pool.pop()
        except IndexError:
            conn = RespConnection(self.address, self.timeout)
        conn.settimeout(self.timeout)
        return conn

    def server_id(self) -> bytes | None:
        """The ``run_id`` of the redis server the leases live on (unique to a
        server process), or None if it does not say."""
        conn = self._connection()
        try:
            info = conn.call("INFO", "server")
        except BaseException:
            conn.close()
            raise
        self._pool.append(conn)
        for line in bytes(info).splitlines():
            if line.startswith(b"run_id:"):
                return line[7:].strip()
        return None

    def flush_keeping_members(self) -> int:
        """``FLUSHDB`` of the members' database (0: connections select no other),
        keeping every live lease as it was (:data:`FLUSH_KEEPING_MEMBERS`).

        Why: an L2 on this redis and database clears with ``FLUSHDB``, which
        would take the hosts' leases with it; a writer process that had not
        seen a host would then wait for nobody until that host's next renewal,
        and a host stopped meanwhile would serve values the strict writes after
        the clear had replaced. Kept with their own values and remaining lives,
        the leases say what they said before.

        The ack lists too: a host's ack pushed but not yet popped by its writer
        (another process, another host) would go with the ``FLUSHDB``, and that
        writer, which hears each host's ack once, would wait ``give_up_after``
        and raise :class:`StrictWriteUnconfirmed` with every host healthy,
        whenever a clear falls between an ack's push and its pop."""
        conn = self._connection()
        try:
            kept = conn.call("EVAL", FLUSH_KEEPING_MEMBERS, 1, self.members, self.member_prefix,
                             _glob_escaped(self.ack_prefix) + "*", ACK_TTL_MS)
        except BaseException:
            conn.close()
            raise
        self._pool.append(conn)
        return int(kept)

    def _forget(self, hosts: Iterable[str]) -> None:
        """Hosts that left: no later write waits for them (until they register
        again, when a listing shows them)."""
        for host in hosts:
            self.known.pop(host, None)

    def close(self) -> None:
        while self._pool:
            with contextlib.suppress(Exception):
                self._pool.pop().close()
