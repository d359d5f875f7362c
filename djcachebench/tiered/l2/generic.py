"""The adapter of an L2 no family module knows: a third-party backend, or a
subclass of a known one whose family does not let it keep its base's answers.

It answers only what the backend declares (``base.L2Adapter``): without a
declared failure probe the L1 keeps no absences and no written values; without
a declared expiry reader it keeps only what its own process wrote (whose expiry
the writer knows, counted in whole seconds less one); the LOCATION names the
store as spelled.
"""

from __future__ import annotations

from djcachebench.tiered.l2.base import L2Adapter

__all__ = ["GenericAdapter"]


class GenericAdapter(L2Adapter):
    """Nothing known beyond the backend's declared capabilities."""
