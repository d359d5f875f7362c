"""Where the harness finds its data: the repository's ``backends/`` and ``bench/``.

Why repository-relative paths and not package data: the target definitions
(``backends/*.py``) and scenarios (``bench/scenarios/*.toml``) are meant to be
read and edited next to the published results, at the top of the repository
(the package in ``djcachebench/``, targets in ``backends/``, scenarios and
results in ``bench/``). The harness is installed editable from a checkout
(``pip install -e .[bench]``, what ``bench/run.sh`` does), so the checkout is
``Path(djcachebench.__file__).parent.parent``. From a non-editable install
there is no checkout: the error says so and how to point at one.
"""

from __future__ import annotations

import os
from pathlib import Path

import djcachebench

#: Set to a checkout's top directory to use its backends/ and bench/ from anywhere.
ROOT_ENV = "DJCACHEBENCH_ROOT"


class DataNotFound(FileNotFoundError):
    """A data directory of the checkout is missing."""


def repo_root() -> Path:
    """The checkout's top directory (``$DJCACHEBENCH_ROOT`` wins when set)."""
    override = os.environ.get(ROOT_ENV)
    if override:
        return Path(override).resolve()
    return Path(djcachebench.__file__).resolve().parent.parent


def _data_dir(*parts: str) -> Path:
    path = repo_root().joinpath(*parts)
    if not path.is_dir():
        raise DataNotFound(
            f"{path} not found: the benchmark reads {'/'.join(parts)}/ from a checkout of "
            f"djcachebench. Install it editable from a checkout (pip install -e '.[bench]') "
            f"or set {ROOT_ENV} to the checkout's top directory."
        )
    return path


def backends_dir() -> Path:
    """``backends/``: one target definition per file."""
    return _data_dir("backends")


def scenarios_dir() -> Path:
    """``bench/scenarios/``: one TOML file per workload."""
    return _data_dir("bench", "scenarios")


def default_results_dir() -> Path:
    """``bench/results/`` of the checkout, or of the current directory without one."""
    bench = repo_root() / "bench"
    return (bench if bench.is_dir() else Path.cwd() / "bench") / "results"
