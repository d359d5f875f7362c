"""What TieredCache knows of particular L2 backends, filed by backend.

``base.L2Adapter`` is the one protocol: what TieredCache asks of its L2 (the
expiry of what a read returns, whether a miss can hide a failure, whether a
read gives back what was set, the pickles it hands over, how long it keeps a
timeout, the lean ``set`` and the ``clear`` of a redis, what its LOCATION names),
answered for a backend nothing is known of. One module per family overrides
what it knows: ``sqlite``, ``redis``, ``memcached``, ``locmem``, ``filebased``,
``database``, ``diskcache``, ``nested`` (a TieredCache over a TieredCache);
``generic`` is the fallback. Adding an L2 is one module, its ``CLASSES`` here,
and its tests.

How one is chosen: by the backend's EXACT class (its dotted path), never a
subclass, which may store, fail or expire otherwise; a subclass gets its
nearest known base's ``descendant`` adapter (``generic`` unless the family lets
its subclasses keep what belongs to the store: its LOCATION's meaning, the
server's clock, its ``clear``). Any backend, subclass or not, can declare the
value capabilities itself (``tiered_failure_count()``,
``tiered_returns_what_was_set``, ``get_with_expiry()``, ...: ``base.py``).
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from djcachebench.tiered.l2 import (
    database,
    diskcache,
    filebased,
    locmem,
    memcached,
    nested,
    redis,
    sqlite,
)
from djcachebench.tiered.l2.base import Directory, L2Adapter
from djcachebench.tiered.l2.generic import GenericAdapter

__all__ = ["Directory", "L2Adapter", "adapter_class", "adapter_for"]

#: Every known backend by the dotted path of its class.
_EXACT: dict[str, type[L2Adapter]] = {
    **sqlite.CLASSES, **redis.CLASSES, **memcached.CLASSES, **locmem.CLASSES,
    **filebased.CLASSES, **database.CLASSES, **diskcache.CLASSES, **nested.CLASSES,
}


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_adapter(cls: type) -> type[L2Adapter]:
    exact = _EXACT.get(_path(cls))
    if exact is not None:
        return exact
    for base in cls.__mro__[1:]:
        family = _EXACT.get(_path(base))
        if family is not None:
            return family.descendant or GenericAdapter
    return GenericAdapter


def adapter_for(l2: Any) -> L2Adapter:
    """The adapter of a built L2 backend (``TieredCache`` resolves it once)."""
    return _class_adapter(type(l2))(l2)


def adapter_class(backend: str) -> type[L2Adapter]:
    """The adapter class of a ``BACKEND`` path, for what is known of its store
    before a backend is built (``tiered/locations.py``): the path as spelled
    first (no import needed), else its class; generic when it cannot be imported."""
    exact = _EXACT.get(backend)
    if exact is not None:
        return exact
    try:
        cls = import_string(backend)
    except ImportError:
        return GenericAdapter
    return _class_adapter(cls) if isinstance(cls, type) else GenericAdapter
