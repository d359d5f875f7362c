"""diskcache's ``DjangoCache`` as the L2: a SQLite-backed cache in a directory.

Its ``get`` can return the expiry with the value (``expire_time=True``) and it
keeps a timeout exactly; a database timeout is turned into a miss (so misses
are not trusted: no failure probe), and it is not known to give back what was
set. Its LOCATION is the directory it expands (``~`` and ``$VARS``).
"""

from __future__ import annotations

import math
import os
from typing import Any

from djcachebench.tiered.l2.base import (
    Directory,
    ExpiryReader,
    L2Adapter,
    WrittenExpiry,
    exact_expiry,
)

__all__ = ["CLASSES"]


class DiskCacheAdapter(L2Adapter):
    def known_expiry_reader(self) -> ExpiryReader | None:
        l2 = self.l2

        def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
            value, expires = l2.get(key, default, version=version, expire_time=True)
            if value is default:
                return default, None
            return value, math.inf if expires is None else expires

        return read

    def written_expiry(self) -> WrittenExpiry:
        return exact_expiry

    @classmethod
    def opened_location(cls, location: Any, options: Any, l2: Any) -> Any:
        """The directory as diskcache opens it (``~`` and ``$VARS`` expanded),
        then its real path."""
        if not isinstance(location, (str, os.PathLike)):
            return location
        path = os.path.expandvars(os.path.expanduser(os.fspath(location)))
        return Directory(os.path.realpath(path))


CLASSES: dict[str, type[L2Adapter]] = {
    "diskcache.djangocache.DjangoCache": DiskCacheAdapter,
}
