"""Shared helpers of the TieredCache tests (not a conftest: that file is the harness's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from djcachebench.backends.tiered import TieredCache

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
SQLITE = "djcachebench.backends.sqlite.ShardedSQLiteCache"
TIERED = "djcachebench.backends.tiered.TieredCache"


def locmem_tiered(tmp_path: Path, name: str = "l2", **options: Any) -> TieredCache:
    """A TieredCache over a LocMemCache private to this test (LOCATION = tmp path).

    Two calls with the same ``name`` share the L2 store and the generation table
    but, when their ``options`` differ, not the L1: like two processes.
    """
    opts = {
        "L2": {"BACKEND": LOCMEM, "LOCATION": f"{tmp_path}/{name}"},
        "GENERATION_PATH": str(tmp_path / f"{name}.generations.mmap"),
        **options,
    }
    return TieredCache("", {"OPTIONS": opts})


def sqlite_tiered(tmp_path: Path, **options: Any) -> TieredCache:
    opts = {"L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "sqlite")}, **options}
    return TieredCache("", {"OPTIONS": opts})
