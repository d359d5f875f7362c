"""A write's cross-host invalidation in the L2's own round trip (COHERENCE="cluster").

When the L2 is the redis that carries the invalidations (the default
``COHERENCE_URL``), ``set`` sends ``SET`` and ``PUBLISH`` in one pipeline on the
L2's connection pool instead of a ``SET`` and then a ``PUBLISH`` of its own: one
round trip per write instead of two. Why it keeps the cross-host guarantee:

* redis runs a pipeline's commands in order, so a subscriber receives the
  invalidation only after the new value is in the L2: a remote reader that
  refills after applying it reads the new value, and one that read before keeps
  nothing (its token predates the remote stamp), as with the separate publish;
* the write returns after redis answered the ``PUBLISH`` (``docs/architecture.md``,
  Across hosts: the bound counts from that answer);
* the message is numbered on an inline stream of the publisher
  (``Publisher.inline_message``), so a lost one is a gap the receivers see.

If the pipeline fails, the write is done again through the L2's own ``set``
(with its own error handling: ``IGNORE_EXCEPTIONS`` and the like); a ``set`` is
idempotent, and the key is then published through the publisher's queue as any
write's is. Only ``set`` goes this way: it is the write a site makes most, and
the others (``add``, ``delete``, counters) have results a blind retry could change.

Which L2s: those whose adapter has a lean send (``tiered/l2/redis.py``: exactly
Django's ``RedisCache`` and django-redis with its ``DefaultClient``; the herd,
shard and sentinel clients write otherwise), when the server they write to is
the ``COHERENCE_URL``'s host and port (pub/sub ignores the database number).
The commands are the ones those backends' own ``set`` sends for the same
arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from djcachebench.coherence.cluster.publisher import Publisher
from djcachebench.coherence.cluster.resp import parse_url
from djcachebench.tiered.l2.base import InlineSend, L2Adapter

__all__ = ["InlineSet", "inline_set"]


def _same_server(url: Any, coherence_url: str) -> bool:
    try:
        a, b = parse_url(str(url)), parse_url(coherence_url)
    except ValueError:
        return False
    return (a.host, a.port) == (b.host, b.port)


class InlineSet:
    """``set`` of a redis L2 in one lean send, with the key's invalidation in it
    when a ``publisher`` is given (see the module doc)."""

    def __init__(self, l2: BaseCache, publisher: Publisher | None, send: InlineSend,
                 makes_final: Callable[[Any, Any], str]) -> None:
        self._l2 = l2
        self._publisher = publisher
        self._send = send
        self._final = makes_final
        self.fallbacks = 0  # sends that failed (then the L2's own set ran)

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: Any = None, final: str | None = None) -> tuple[str | None, Any]:
        """Write; returns ``(covered, result)``: the final key if its invalidation
        went with the write (the caller must :meth:`done` after its own stamp),
        else None; and what the L2's own ``set`` would have returned."""
        publisher = self._publisher
        if publisher is None:
            try:
                result = self._send(key, value, timeout, version,
                                    final or self._final(key, version), None)
            except Exception:
                self.fallbacks += 1
                result = self._l2.set(key, value, timeout, version=version)
            return None, result
        if final is None:
            final = self._final(key, version)
        stream, message, made = publisher.inline_message(final)
        try:
            result = self._send(key, value, timeout, version, final, message)
        except Exception:
            publisher.inline_done(stream, None)
            self.fallbacks += 1
            return None, self._l2.set(key, value, timeout, version=version)
        publisher.inline_done(stream, made)
        publisher.cover(final)
        return final, result

    def done(self) -> None:
        if self._publisher is not None:
            self._publisher.cover(None)


def inline_set(adapter: L2Adapter, publisher: Publisher | None,
               coherence_url: str | None) -> InlineSet | None:
    """The lean ``set`` for the adapter's L2 (None if it has none:
    ``L2Adapter.inline_sender``), carrying the invalidation, on the publisher's
    host channel, when ``publisher`` is given and the L2's write server is the
    ``coherence_url``'s."""
    l2 = adapter.l2
    channel = None if publisher is None else publisher.channel
    found = adapter.inline_sender(channel)
    if found is None:
        return None
    send, server = found
    if publisher is not None and (coherence_url is None
                                  or not _same_server(server, coherence_url)):
        publisher = None  # another redis carries the invalidations: they queue

    def makes_final(key: Any, version: Any) -> str:
        return l2.make_key(key, version=version)

    return InlineSet(l2, publisher, send, makes_final)
