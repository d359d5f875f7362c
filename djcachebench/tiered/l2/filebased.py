"""Django's FileBasedCache as the L2: a file per key in a directory.

It raises on every failure, gives back what was set (it pickles), keeps a
timeout exactly, and each file starts with the entry's expiry. Its LOCATION is
the directory ``os.path.abspath`` makes of it, for its subclasses too.
"""

from __future__ import annotations

import math
import os
import pickle
import time
import zlib
from typing import Any

from djcachebench.tiered.l2.base import Directory, ExpiryReader, L2Adapter, LocalPicklingAdapter
from djcachebench.tiered.l2.generic import GenericAdapter

__all__ = ["CLASSES"]


def _opened_directory(cls: type, location: Any, options: Any, l2: Any) -> Any:
    """The directory as FileBasedCache opens it, then its real path: it takes
    ``os.path.abspath`` of LOCATION as written (a ``~`` is a directory named
    ``~``, ``..`` is removed before links are followed, spaces count)."""
    if not isinstance(location, (str, os.PathLike)):
        return location
    return Directory(os.path.realpath(os.path.abspath(os.fspath(location))))


class FileBasedDescendant(GenericAdapter):
    """A subclass of FileBasedCache: nothing known of its values; its directory
    is its base's."""

    opened_location = classmethod(_opened_directory)


class FileBasedAdapter(LocalPicklingAdapter):
    descendant = FileBasedDescendant
    opened_location = classmethod(_opened_directory)

    def known_expiry_reader(self) -> ExpiryReader | None:
        """FileBasedCache's own ``get``: the expiry is the first pickle in the file.

        Calls FileBasedCache's private ``_key_to_file`` and ``_delete``: it has no
        public read that returns the expiry stored with a value, and naming or
        deleting the file any other way could miss the file its ``get`` reads.
        """
        l2 = self.l2

        def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
            fname = l2._key_to_file(key, version)
            try:
                with open(fname, "rb") as f:
                    try:
                        expires = pickle.load(f)
                    except EOFError:
                        return default, None
                    if expires is not None and expires < time.time():
                        f.close()
                        l2._delete(fname)
                        return default, None
                    value = pickle.loads(zlib.decompress(f.read()))
            except FileNotFoundError:
                return default, None
            return value, math.inf if expires is None else expires

        return read


CLASSES: dict[str, type[L2Adapter]] = {
    "django.core.cache.backends.filebased.FileBasedCache": FileBasedAdapter,
}
