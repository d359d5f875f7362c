"""TieredCache's write API: Django's write methods, each handed to the ``Writer``.

Every write goes to the L2 and then stamps, publishes and keeps as
``djcachebench.tiered.writes`` says; what this layer adds is the caller's
default version and, under ``COHERENCE="cluster"``, handing the write's
cross-host invalidations to redis before the write returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from djcachebench.tiered.breaker import L2Unavailable, refused_write
from djcachebench.tiered.writes import Writer

__all__ = ["WriteAPI"]


def _then_flush(method: Any) -> Any:
    """Run a write through ``WriteAPI._linked``: then hand its cross-host
    invalidations to redis before it returns (``COHERENCE="cluster"``; nothing
    to do otherwise); with ``STRICT_LEASE``, return only once every live host
    applied them. A write the L2's open breaker refused answers as the L2
    answers a failed write (``_refused``)."""

    @functools.wraps(method)
    def write(self: WriteAPI, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._linked(lambda: method(self, *args, **kwargs))
        except L2Unavailable:
            return self._refused(method.__name__, args)

    return write


class WriteAPI:
    """Mixed into TieredCache before ``BaseCache``; uses its ``_writer``,
    ``_version``, ``_flush`` and ``_strict``."""

    _writer: Writer
    _version: Any
    _flush: Callable[..., Any] | None
    _flush_mark: Callable[[], int] | None
    _strict: Callable[[Callable[[], Any]], Any] | None
    _refuses_quietly: bool

    def _refused(self, method: str, args: tuple[Any, ...]) -> Any:
        """A write the L2's open breaker refused (the Writer stamped its keys):
        raised on, or, over an L2 that answers its own failed writes instead of
        raising, answered as it would (``breaker.refused_write``)."""
        if not self._refuses_quietly:
            raise  # the L2Unavailable being handled: called from its except
        return refused_write(method, args)

    # set, add and delete, the hot ones, skip the decorator's frame when there
    # is nothing to flush (every COHERENCE but "cluster").

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> Any:
        if version is None:
            version = self._version
        try:
            if self._flush is None:
                return self._writer.set(key, value, timeout, version)
            return self._linked(lambda: self._writer.set(key, value, timeout, version))
        except L2Unavailable:
            return self._refused("set", ())

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> bool:
        if version is None:
            version = self._version
        try:
            if self._flush is None:
                return self._writer.add(key, value, timeout, version)
            return self._linked(lambda: self._writer.add(key, value, timeout, version))
        except L2Unavailable:
            return self._refused("add", ())

    def delete(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        try:
            if self._flush is None:
                return self._writer.delete(key, version)
            return self._linked(lambda: self._writer.delete(key, version))
        except L2Unavailable:
            return self._refused("delete", ())

    def _linked(self, write: Callable[[], Any]) -> Any:
        """``write()``, then its cross-host invalidations handed to redis before
        this returns; with ``STRICT_LEASE``, once every live host applied them."""
        strict = self._strict
        if strict is not None:
            return strict(write)
        flush = self._flush
        if flush is None:
            return write()
        mark = self._flush_mark() if self._flush_mark is not None else None
        try:
            result = write()
        except BaseException:
            flush()
            raise
        # Raises PublicationDropped if a message that may carry this write's
        # invalidation was dropped: never acknowledged without its PUBLISH.
        flush(mark)
        return result

    @_then_flush
    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._writer.touch(key, timeout, self._version if version is None else version)

    @_then_flush
    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self._writer.incr(key, delta, self._version if version is None else version)

    @_then_flush
    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self._writer.decr(key, delta, self._version if version is None else version)

    @_then_flush
    def set_many(self, data: Any, timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None) -> list[Any]:
        return self._writer.set_many(data, timeout,
                                     self._version if version is None else version)

    @_then_flush
    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> Any:
        return self._writer.delete_many(keys, self._version if version is None else version)

    @_then_flush
    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._writer.incr_version(key, delta,
                                         self._version if version is None else version)

    def decr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self.incr_version(key, -delta, version)

    @_then_flush
    def clear(self) -> None:
        self._writer.clear()

    def close(self, **kwargs: Any) -> None:
        """Django calls this after every request: it closes the L2 only. The L1
        and the table are the process's, and stay warm."""
        self._writer.close(**kwargs)
