"""Where the harness finds its data: target definitions and scenarios, shipped in the package.

The project keeps them at the top of the repository, where a reader of the
published results looks first: ``backends/*.py`` (one target a file) and
``bench/scenarios/*.toml`` (one workload a file), beside ``bench/results/``.
The package reaches them through ``djcachebench/bench/data/``, whose
``backends`` and ``scenarios`` are symbolic links to those two directories in
a checkout; building a wheel copies the linked files into the package
(``package_data`` in setup.cfg), so a non-editable install carries its own
copy and needs no checkout. One path, the same from a checkout and from a
wheel: the harness never guesses where a checkout is.

``$DJCACHEBENCH_ROOT`` still points the harness at another checkout's
``backends/`` and ``bench/scenarios/`` (to run edited definitions with an
installed package).

Results are written under the current directory (``./bench/results/``) unless
``--out`` says otherwise, never into the installed package or a checkout the
command is not run from.
"""

from __future__ import annotations

import os
from pathlib import Path

import djcachebench

#: Set to a checkout's top directory to use its backends/ and bench/scenarios/.
ROOT_ENV = "DJCACHEBENCH_ROOT"
#: The package's data directory (links in a checkout, copies in a wheel).
DATA_DIR = Path(__file__).resolve().parent / "data"


class DataNotFound(FileNotFoundError):
    """A data directory of the package (or of $DJCACHEBENCH_ROOT) is missing."""


def repo_root() -> Path:
    """The checkout the running package's code comes from.

    Only used to name the code's commit in results; from a wheel it is the
    site-packages directory, which has no ``.git``. ``$DJCACHEBENCH_ROOT``
    does not count here: it lends its target definitions and scenarios, not
    the code that ran (a wheel's run would name that checkout's commit as its
    code).
    """
    return Path(djcachebench.__file__).resolve().parent.parent


def _data_dir(packaged: str, *in_checkout: str) -> Path:
    override = os.environ.get(ROOT_ENV)
    path = Path(override).resolve().joinpath(*in_checkout) if override else DATA_DIR / packaged
    if not path.is_dir():
        where = f"${ROOT_ENV}/{'/'.join(in_checkout)}" if override else "the installed package"
        raise DataNotFound(
            f"{path} not found: {where} has no {packaged}. Reinstall djcachebench "
            f"(pip install 'djcachebench[bench]') or set {ROOT_ENV} to a checkout's top directory."
        )
    return path


def backends_dir() -> Path:
    """The target definitions: one ``*.py`` file per compared backend."""
    return _data_dir("backends", "backends")


def scenarios_dir() -> Path:
    """The workloads: one TOML file per scenario."""
    return _data_dir("scenarios", "bench", "scenarios")


def default_results_dir() -> Path:
    """``./bench/results`` under the current directory (``--out`` chooses another)."""
    return Path.cwd() / "bench" / "results"
