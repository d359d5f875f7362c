"""A TieredCache as the L2 of another TieredCache: what is known of it is what
is known of the L2 beneath it, which it offers as ``l2_adapter`` (its failure
probe it declares itself, as ``tiered_failure_count``, when it has one), and
it keeps a timeout as its own writer computes it. Its store is the store
beneath (it declares ``store_identity``, read by ``tiered/locations.py``).

Recognised by the class path alone: ``tiered/`` stands below the backends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from djcachebench.tiered.l2.base import FailureProbe, L2Adapter, WrittenExpiry, exact_expiry

__all__ = ["CLASSES"]


class NestedTieredAdapter(L2Adapter):
    def _beneath(self) -> L2Adapter:
        return self.l2.l2_adapter  # type: ignore[no-any-return]

    def known_failure_probe(self) -> FailureProbe | None:
        return self._beneath().failure_probe()

    def known_read_failure_probe(self) -> FailureProbe | None:
        return self._beneath().read_failure_probe()

    def known_returns_what_was_set(self) -> bool:
        return self._beneath().returns_what_was_set()

    def read_back_differs(self) -> Callable[[Any], bool] | None:
        return self._beneath().read_back_differs()

    def written_expiry(self) -> WrittenExpiry:
        return exact_expiry


CLASSES: dict[str, type[L2Adapter]] = {
    "djcachebench.backends.tiered.TieredCache": NestedTieredAdapter,
}
