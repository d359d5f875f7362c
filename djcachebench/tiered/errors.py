"""TieredCache's configuration errors: ``ImproperlyConfigured`` with a system-check id.

Apart from ``config.py`` so that the modules reading parts of the settings
(``locations.py``) raise the same errors without importing the whole reader.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

__all__ = ["E_CONFLICT", "E_CYCLE", "E_NO_ALIAS", "E_OPTIONS", "TieredConfigError"]

# Stable ids for the system checks (djcachebench/checks_tiered.py).
E_OPTIONS = "djcachebench.E101"
E_NO_ALIAS = "djcachebench.E102"
E_CYCLE = "djcachebench.E103"
E_CONFLICT = "djcachebench.E104"


class TieredConfigError(ImproperlyConfigured):
    """``ImproperlyConfigured`` that knows its system-check id."""

    def __init__(self, msg: str, check_id: str) -> None:
        super().__init__(msg)
        self.check_id = check_id
