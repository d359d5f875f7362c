"""What TieredCache needs from an L2: one adapter class, the answers for an L2
nothing is known of; each family module (``sqlite``, ``redis``, ...) overrides
what it knows of its backends.

Two kinds of answer, chosen two ways (``tiered/l2/__init__.py``):

* **Of the values** (instance methods, over a built backend): how a read tells
  the expiry of what it returns, whether a miss can hide a failure, whether a
  read gives back what was set, which pickles the backend hands over, how long
  it keeps what it is given, the lean ``set`` of the cross-host transport. Known
  for a backend's EXACT class only: a subclass may store, fail or expire
  otherwise (and tests' doubles do). Any backend, subclass or not, can state
  them instead, through the documented capabilities read first here:
  ``tiered_failure_count()``, ``tiered_returns_what_was_set``,
  ``get_with_expiry()``, ``get_many_with_expiry()``, ``tiered_get()``,
  ``tiered_set()``.
* **Of the store** (class attributes and class methods, from the BACKEND path
  before a backend is built: ``config.py`` reads them): what a LOCATION names
  (the default generation table and the value board's store identity, in
  ``tiered/locations.py``), the default ``COHERENCE_URL``, what ``clear``
  flushes. A subclass opens the files or servers its base opens, so a family
  may let its subclasses keep these (its ``descendant`` adapter, below).

Why: "L1 is never filled from a failed read". A value the L2 returned is never
a failure, but a *miss* can be: django-redis with ``IGNORE_EXCEPTIONS``,
diskcache on a database timeout and ShardedSQLiteCache after its retry policy
is spent all answer ``default`` instead of raising. The L1 keeps a known
absence (and, for the writing process, the value it just wrote) only when it
can tell that no such masked failure happened during the operation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["Directory", "ExpiryReader", "FailureProbe", "InlineSend", "L2Adapter",
           "LocalPicklingAdapter", "ManyExpiryReader", "WrittenExpiry", "exact_expiry",
           "never_fails", "read_each"]

#: A zero-argument callable whose result changes whenever the L2 has masked a
#: failure in this process (compare it before and after the operation).
FailureProbe = Callable[[], int]
#: ``(key, default, version) -> (value, expires_at)``; ``expires_at`` is
#: ``math.inf`` for no expiry and ``None`` when unknown (the L1 keeps nothing).
ExpiryReader = Callable[[Any, Any, Any], tuple[Any, float | None]]
#: ``(keys, version=None) -> {key: (value, expires_at)}`` for the keys found.
ManyExpiryReader = Callable[..., dict[Any, tuple[Any, float | None]]]
#: ``(timeout, now) -> when the L2 drops a value written at now with that
#: relative timeout``: never later than the L2's own expiry.
WrittenExpiry = Callable[[float, float], float]
#: The lean send of ``tiered/inline.py``: (key, value, timeout, version, final
#: key, message or None) -> what the L2's own ``set`` returns; raises on failure.
InlineSend = Callable[[Any, Any, Any, Any, str, bytes | None], Any]


def never_fails() -> int:
    """The probe of a backend that raises on every failure (a miss from it is real)."""
    return 0


class Directory(str):
    """A LOCATION resolved to the directory its backend opens: taken as it is by
    ``locations._same_store`` (a comma or a space in it is part of the name)."""

    __slots__ = ()


def read_each(single: ExpiryReader) -> ManyExpiryReader:
    """``get_many`` with expiries as one read per key: for in-process and
    local-file L2s, where there is no round trip to save."""
    missing = object()

    def read_many(keys: list[Any], version: Any = None) -> dict[Any, tuple[Any, float | None]]:
        out = {}
        for key in keys:
            value, expires = single(key, missing, version)
            if value is not missing:
                out[key] = (value, expires)
        return out

    return read_many


def exact_expiry(timeout: float, now: float) -> float:
    """The expiry of an L2 that keeps a timeout to the fraction of a second."""
    return now + timeout


def _below_whole_seconds(timeout: float, now: float) -> float:
    return now + float(math.floor(timeout) - 1)


class L2Adapter:
    """What TieredCache asks of its L2, answered for a backend nothing is known
    of (only its declared capabilities count). Family modules subclass it."""

    #: The adapter a subclass of this family's backend gets (when it declares
    #: nothing, it is not known to read, fail or expire as its base does).
    descendant: ClassVar[type[L2Adapter] | None] = None
    #: A store of this process alone (LocMemCache, DummyCache): the value board
    #: names it per process (``coherence.board.LocalStore``).
    process_local: ClassVar[bool] = False
    #: The port a server spelled without one means (memcached's), for telling
    #: two spellings of one store apart.
    default_port: ClassVar[int | None] = None
    #: What COHERENCE="cluster" is refused over, as the error names it: a
    #: store whose files live on one host. None: allowed.
    one_host: ClassVar[str | None] = None

    def __init__(self, l2: Any) -> None:
        self.l2 = l2

    # -- of the values: the declared capability first, then the family's knowledge --

    def failure_probe(self) -> FailureProbe | None:
        """A probe whose result changes whenever the L2 masked a failure in this
        process, or None when that cannot be told: then the L1 keeps neither
        absences nor written-through values for this L2."""
        declared = getattr(self.l2, "tiered_failure_count", None)
        if callable(declared):
            return declared  # type: ignore[no-any-return]
        return self.known_failure_probe()

    def known_failure_probe(self) -> FailureProbe | None:
        return None  # unknown backend (diskcache masks timeouts, for one): do not guess

    def read_failure_probe(self) -> FailureProbe | None:
        """:meth:`failure_probe` for reads: whether a miss the L2 answered may hide
        a failure (then no absence is kept), where a client masks on reads what it
        raises on writes."""
        declared = getattr(self.l2, "tiered_failure_count", None)
        if callable(declared):
            return declared  # type: ignore[no-any-return]
        return self.known_read_failure_probe()

    def known_read_failure_probe(self) -> FailureProbe | None:
        return self.known_failure_probe()

    def returns_what_was_set(self) -> bool:
        """Does ``l2.get`` give back what ``pickle.loads(pickle.dumps(value))`` would?

        Write-through keeps the value the caller passed to ``set``; that is only
        the same as reading it back when the L2 stores values by pickling them.
        msgpack or JSON serializers turn tuples into lists (and worse), and some
        memcached clients store ``bool`` as ``int``: for those (and for unknown
        backends) the writer refills from the L2 like every other process.
        """
        declared = getattr(self.l2, "tiered_returns_what_was_set", None)
        if declared is not None:
            return bool(declared)
        return self.known_returns_what_was_set()

    def known_returns_what_was_set(self) -> bool:
        return False

    def read_back_differs(self) -> Callable[[Any], bool] | None:
        """Which values an L2 that gives back what was set still does not give
        back as they were set: the writer keeps none of those. None where there
        are none: a write then asks nothing."""
        return None

    def pickle_returning(self) -> tuple[Callable[..., tuple[Any, Any, bytes | None]] | None,
                                        Callable[..., bytes | None] | None]:
        """The L2's ``get`` and ``set`` that also give back the pickle of the value
        (``tiered_get``: ``(value, expires_at, pickle or None)``; ``tiered_set``: the
        pickle or None), each None where the backend does not declare it.

        Why: the L1 keeps a mutable value pickled, so that a caller who mutates
        what it got cannot change what the next read returns. An L2 that pickles
        values anyway (ShardedSQLiteCache with the pickle serializer) can hand
        those bytes over instead of the value being pickled again.
        """
        read = getattr(self.l2, "tiered_get", None)
        write = getattr(self.l2, "tiered_set", None)
        return (read if callable(read) else None), (write if callable(write) else None)

    def expiry_reader(self) -> ExpiryReader | None:
        """A ``get`` that also returns the wall-clock expiry of the value it read.

        The L1 takes a value's deadline from its own read, never from anything
        shared with other keys. None when the backend cannot tell (memcached):
        the L1 then keeps only what its own process wrote, whose expiry the
        writer knows.
        """
        declared = getattr(self.l2, "get_with_expiry", None)
        if callable(declared):
            return declared  # type: ignore[no-any-return]
        return self.known_expiry_reader()

    def known_expiry_reader(self) -> ExpiryReader | None:
        return None

    def many_expiry_reader(self, single: ExpiryReader | None) -> ManyExpiryReader | None:
        """``get_many`` with each value's expiry: ``{key: (value, expires_at)}``.

        The backend's own when it declares ``get_many_with_expiry``; else the
        family's, given the single-key reader chosen (``single``); None, and
        ``get_many`` fills the L1 only where the value board knows the expiry.
        """
        declared = getattr(self.l2, "get_many_with_expiry", None)
        if callable(declared):
            return declared  # type: ignore[no-any-return]
        if single is None:
            return None
        return self.known_many_expiry_reader(single)

    def known_many_expiry_reader(self, single: ExpiryReader) -> ManyExpiryReader | None:
        return None

    def written_expiry(self) -> WrittenExpiry:
        """When the L2 drops a value it was given with a relative timeout.

        Backends that keep whole seconds truncate (and memcached counts them on
        a clock that ticks once a second): keeping a written value in L1 for
        the full fractional timeout would serve it after the L2 dropped it.
        Unknown backends get memcached's rule, whole seconds less one: the L1
        may only end earlier.
        """
        return _below_whole_seconds

    def inline_sender(self, channel: bytes | None) -> tuple[InlineSend, str] | None:
        """The lean ``set`` of ``tiered/inline.py`` and the server it writes to,
        for an L2 whose ``set`` is one command this adapter can send itself (with
        ``PUBLISH channel`` in the same round trip); None for the others."""
        return None

    def flushed_client(self) -> Callable[[], Any] | None:
        """How to get the redis client whose database ``l2.clear()`` flushes, when
        that clear is exactly one ``FLUSHDB`` on it (``cluster.l2_clear``); None
        for any other L2 (its own clear is then used, as it is)."""
        return None

    # -- of the store: from the BACKEND path, before a backend is built --------

    @classmethod
    def opened_location(cls, location: Any, options: Any, l2: Any) -> Any:
        """``location`` as the backend itself reads it: what it opens, not what
        the settings spell (two spellings taken for one store, or one store for
        two, each give a wrong value or an unseen write)."""
        return location

    @classmethod
    def kwarg_db(cls, options: Any) -> Any:
        """The redis database an L2's OPTIONS name for a redis URL in its
        LOCATION, as its client passes it (the ``db`` keyword; a URL's own
        database wins over it): Django's RedisCache passes OPTIONS to the pool."""
        return options.get("db") if isinstance(options, dict) else None

    @classmethod
    def database_of(cls, l2: Any) -> Any:
        """What beyond its LOCATION names the store (the databases of Django's
        DatabaseCache, whose LOCATION is only a table name); None."""
        return None

    @classmethod
    def default_coherence_url(cls, location: Any) -> str | None:
        """The redis the cross-host transport uses when ``COHERENCE_URL`` is not
        set: the L2's own, for the redis L2s. Raises ``LookupError`` for an L2
        that has none (then the setting is required)."""
        raise LookupError("no redis of its own")


class LocalPicklingAdapter(L2Adapter):
    """An L2 in this process or in local files (LocMemCache, FileBasedCache)
    that raises on every failure, stores values pickled (so a read gives back
    what was set) and keeps a timeout exactly; reading many keys is one read
    per key, there being no round trip to save. Its family adds the reader."""

    def known_failure_probe(self) -> FailureProbe | None:
        return never_fails

    def known_returns_what_was_set(self) -> bool:
        return True

    def known_many_expiry_reader(self, single: ExpiryReader) -> ManyExpiryReader | None:
        return read_each(single)

    def written_expiry(self) -> WrittenExpiry:
        return exact_expiry
