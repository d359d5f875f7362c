"""What one TieredCache instance is built from: its L2, the process's shared
state, and what is known of the L2, asked once.

:func:`wire` reads the settings, builds the L2, finds (or opens) what the
instances of the configuration share in the process, asks the L2's adapter
(``tiered/l2/``) what it can do, and puts the circuit breaker and the cross-host
link in front of the calls that reach the L2. It returns one frozen
:class:`Wiring`, from which TieredCache takes what its hit path holds and the
``Writer`` (and its ``WriteThrough``) everything they need.

Why apart from ``backends/tiered.py``: the class is the hit path and the Django
API; choosing which reads and writes go through the breaker, and whether a
write may keep its value, is decided once here and never on a call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from django.core.cache.backends.base import BaseCache

from djcachebench.coherence.cluster import ClusterLink
from djcachebench.coherence.stamper import EngineStamper
from djcachebench.tiered.breaker import Breaker, GuardedInline, GuardedL2, breaker_for, guarded
from djcachebench.tiered.cluster import cluster_link, l2_clear
from djcachebench.tiered.config import TieredConfig, read_config
from djcachebench.tiered.fill import Filler
from djcachebench.tiered.inline import InlineSet, inline_set
from djcachebench.tiered.l2 import adapter_for
from djcachebench.tiered.l2.base import ExpiryReader, FailureProbe, ManyExpiryReader, WrittenExpiry
from djcachebench.tiered.stale import StaleCopies
from djcachebench.tiered.state import L1Index, Shared, build_l2, open_shared

__all__ = ["Wiring", "wire"]


@dataclass(frozen=True, slots=True)
class Wiring:
    """One TieredCache instance's parts (see :func:`wire`)."""

    config: TieredConfig
    l2: BaseCache
    #: What the instances of this configuration share in the process
    #: (``state.Shared``: L1 map, table, board, counters, admission).
    shared: Shared
    #: The store's name for get_or_set's waiting callers (``djcachebench.stampede``).
    scope: Hashable
    #: How the L1 names a call's entry; reads and writes share the rule.
    index: L1Index
    #: ``L1_TIMEOUT`` in seconds (``math.inf`` for none).
    l1_timeout: float
    #: The L1 fills that reads and write-through share (``tiered/fill.py``).
    filler: Filler

    # -- what the L2's adapter says (tiered/l2/) ------------------------------
    #: Changes whenever the L2 masked a failure (None: that cannot be told).
    failure_probe: FailureProbe | None
    #: The same for reads: a miss may be kept as a known absence only under it.
    read_probe: FailureProbe | None
    #: A get that also returns the value's expiry (None: reads keep nothing
    #: unless the board has the expiry its write published).
    read_with_expiry: ExpiryReader | None
    read_many_with_expiry: ManyExpiryReader | None
    #: A get that hands over the pickle it loaded (``tiered_get``).
    read_pickle: Callable[..., tuple[Any, Any, bytes | None]] | None
    #: When the L2 drops a value given a relative timeout (whole seconds...).
    written_expiry: WrittenExpiry
    #: The L2 gives back what was set (``returns_what_was_set``)...
    keep_written: bool
    #: ... except these values (``read_back_differs``).
    differs: Callable[[Any], bool] | None

    # -- writes ----------------------------------------------------------------
    #: Does a write proved to be the key's latest keep its value in this L1
    #: (and publish it on the board)? (``tiered/write_through.py``)
    write_through: bool
    #: The L2's engine stamper writes announce themselves to, when write-through
    #: goes by the engine's transaction order (``coherence/stamper.py``).
    stamper: EngineStamper | None
    #: The L2 as the writes call it: through the breaker when there is one.
    write_l2: Any
    #: The L2's set that gives back the pickle it stored (``tiered_set``).
    set_pickle: Callable[..., bytes | None] | None
    #: How ``clear`` empties the L2 (``cluster.l2_clear``).
    clear_l2: Callable[[], Any]
    #: A set and its cross-host PUBLISH in one round trip (``tiered/inline.py``).
    inline: InlineSet | GuardedInline | None
    #: ``COHERENCE="cluster"``: a write returns only once its invalidations were
    #: handed to redis, so that the cross-host bound counts from the
    #: acknowledgement (docs/architecture.md, Across hosts).
    link: ClusterLink | None

    # -- the L2's circuit breaker (tiered/breaker.py) ------------------------------
    breaker: Breaker | None
    #: The breaker's caller for reads (None without a breaker).
    read_l2: Callable[..., Any] | None
    #: ``SERVE_STALE`` in seconds, 0.0 without a breaker.
    stale_for: float
    stale: StaleCopies | None


def wire(location: str, params: dict[str, Any]) -> Wiring:
    """The parts of a TieredCache built with ``location`` and ``params`` (module doc)."""
    config = read_config(location, params)
    l2 = build_l2(config)
    # The L2's own scope when it has one, so that callers through this alias and
    # through the L2's wait together.
    scope = getattr(l2, "stampede_scope", None) or (config.l2_backend, repr(config.l2_location))
    # The identity includes the resolved L2: an alias name can be pointed at
    # another store (override_settings), and must not find the old store's L1.
    shared = open_shared(repr((location, params, config.l2_backend, config.l2_location,
                               config.l2_params)), config, l2)
    l1_timeout = math.inf if config.l1_timeout is None else config.l1_timeout
    adapter = adapter_for(l2)
    failure_probe = adapter.failure_probe()
    read_with_expiry = adapter.expiry_reader()
    read_pickle, set_pickle = adapter.pickle_returning()
    keep_written = adapter.returns_what_was_set()
    # Write-through proves a write the key's latest either by the engine's
    # transaction order (the L2 stamps inside its transactions) or by a
    # compare-and-stamp, which needs an L2 whose failed writes can be told and
    # that gives back what was set (or a board to publish the expiry on, where
    # the L2 cannot tell it on read).
    stamper = shared.stamper
    write_through = config.l1_max_entries > 0 and (
        (stamper is not None and keep_written)
        or (failure_probe is not None and (keep_written or (
            shared.board is not None and read_with_expiry is None))))
    link = cluster_link(shared.table) if config.coherence == "cluster" else None
    write_l2: Any = l2
    clear_l2 = l2_clear(l2, link)
    # A strict write sends its own message (strict.py), not the set's.
    inline: InlineSet | GuardedInline | None = inline_set(
        adapter, None if config.strict_lease else link and link.publisher, config.coherence_url)
    # Every call that reaches the L2 goes through the breaker: reads in
    # TieredCache, writes in the Writer.
    breaker = breaker_for(config, shared, failure_probe)
    read_l2 = None
    stale_for = 0.0
    stale = None
    if breaker is not None:
        read_l2, call_write = breaker.callers(failure_probe)
        write_l2 = GuardedL2(l2, call_write)
        clear_l2 = guarded(call_write, clear_l2)  # type: ignore[assignment]
        set_pickle = guarded(call_write, set_pickle)
        inline = None if inline is None else GuardedInline(inline, call_write)
        stale_for = config.serve_stale or 0.0
        if stale_for:
            stale = StaleCopies(shared.l1.records.get, shared.l1.get, breaker, shared.stats,
                                stale_for)
    return Wiring(
        config=config, l2=l2, shared=shared, scope=scope, index=L1Index(l2),
        l1_timeout=l1_timeout,
        filler=Filler(shared, l2, l1_timeout),
        failure_probe=failure_probe, read_probe=adapter.read_failure_probe(),
        read_with_expiry=read_with_expiry,
        read_many_with_expiry=adapter.many_expiry_reader(read_with_expiry),
        read_pickle=read_pickle, written_expiry=adapter.written_expiry(),
        keep_written=keep_written, differs=adapter.read_back_differs(),
        write_through=write_through, stamper=stamper if write_through else None,
        write_l2=write_l2, set_pickle=set_pickle, clear_l2=clear_l2, inline=inline, link=link,
        breaker=breaker, read_l2=read_l2, stale_for=stale_for, stale=stale)
