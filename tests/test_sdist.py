"""The sdist is enough to run the tests from (MANIFEST.in), and its metadata is current.

Distributions build and test from the sdist, not from a git checkout: the sdist
must carry ``tests/`` whole (conftest, settings, helpers and worker modules,
run.sh), the scripts and data the tests reach by path (``backends/``,
``bench/``, the published results they read), and the docs. The fast check here
builds the sdist from a copy of the checkout (about 3 s, offline: the installed
setuptools) and reads its file list and PKG-INFO.

The full check (unpack the sdist outside the checkout, make a virtualenv there,
``pip install -e '.[test,bench]'`` from PyPI, run a subset of the tests from the
unpacked tree) takes minutes and needs PyPI: it runs only with
``DJCB_SDIST_INSTALL=1``.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

import djcachebench

CHECKOUT = Path(__file__).resolve().parent.parent
# Never part of the sdist, and not worth copying to build it.
_LOCAL = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", "build",
                                "dist", ".pytest_cache", ".ruff_cache", ".mypy_cache")


def _skipped(directory: str, names: list[str]) -> set[str]:
    """What is local to this checkout: the patterns above and local runs (bench/results/_*)."""
    local = set(_LOCAL(directory, names))
    if Path(directory).name == "results":
        local |= {n for n in names if n.startswith("_")}
    return local
# What the subset of the full check runs from the unpacked sdist.
FULL_CHECK_TESTS = ["tests/sqlite/test_sqlite_semantics.py", "tests/tiered/test_tiered.py",
                    "tests/sqlite/test_sqlite_checks.py", "tests/bench/test_bench_summary.py"]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist built from a copy of the checkout (the checkout gets no egg-info)."""
    work = tmp_path_factory.mktemp("sdist")
    src = work / "src"
    shutil.copytree(CHECKOUT, src, symlinks=True, ignore=_skipped)
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.build_sdist(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(work / "dist")], cwd=src,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return work / "dist" / done.stdout.split()[-1]


@pytest.fixture(scope="module")
def members(sdist: Path) -> dict[str, tarfile.TarInfo]:
    """The sdist's files by their path under its top directory."""
    with tarfile.open(sdist) as archive:
        return {m.name.split("/", 1)[1]: m for m in archive.getmembers()
                if m.isfile() and "/" in m.name}


def checkout_files(*patterns: str) -> Iterator[str]:
    for pattern in patterns:
        for path in sorted(CHECKOUT.glob(pattern)):
            relative = path.relative_to(CHECKOUT)
            local = relative.as_posix().startswith("bench/results/_")
            if path.is_file() and not local and not any(p.startswith(".") for p in relative.parts):
                yield relative.as_posix()


def _module_file(name: str) -> str | None:
    """The checkout's file of module ``name`` (a package's ``__init__.py``), if it has one."""
    path = name.replace(".", "/")
    if (CHECKOUT / path).is_dir():
        return f"{path}/__init__.py"
    return f"{path}.py" if (CHECKOUT / f"{path}.py").is_file() else None


def imported_test_modules() -> set[str]:
    """The files of ``tests`` modules that some test module imports (absolute or relative)."""
    found = set()
    for path in (CHECKOUT / "tests").rglob("*.py"):
        package = path.relative_to(CHECKOUT).parent.parts  # ("tests", "sqlite"), ...
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1])
                    module = f"{base}.{module}" if module else base
                names = [module, *(f"{module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {f for n in names if n.startswith("tests.") and (f := _module_file(n))}
    return found


def test_the_sdist_carries_what_the_tests_need(members: dict[str, tarfile.TarInfo]) -> None:
    needed = {"tests/conftest.py", "tests/settings.py", "tests/__init__.py", "tests/run.sh",
              "tests/django6-env.sh", "bench/setup-env.sh", "pyproject.toml", "setup.cfg",
              "README.md", "docs/LICENSE"}
    needed |= imported_test_modules()
    needed |= set(checkout_files("tests/**/*.py", "tests/*.sh", "backends/*.py", "bench/*.py",
                                 "bench/*.sh", "bench/scenarios/*.toml", "docs/*",
                                 "bench/results/*/results.json", "bench/results/*/*.md"))
    assert {"tests/sqlite/helpers.py", "tests/sqlite/conftest.py", "tests/test_sdist.py"} <= needed
    missing = sorted(needed - set(members))
    assert missing == [], f"not in the sdist: {missing}"
    # The package's data reached through symbolic links arrives as files.
    assert "djcachebench/bench/data/scenarios/reference.toml" in members
    assert not any(m.issym() or m.islnk() for m in members.values())
    # Nothing local: compiled files, virtualenvs, local runs, the charts (megabytes).
    assert not [n for n in members if n.endswith((".pyc", ".png")) or "/__pycache__/" in n
                or n.startswith((".venv", "bench/results/_"))]


def test_the_metadata_states_the_license_and_the_django_versions_tested(
        members: dict[str, tarfile.TarInfo], sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        handle = archive.extractfile(f"{top}/PKG-INFO")
        assert handle is not None
        info = Parser().parsestr(handle.read().decode())
    assert info["Version"] == djcachebench.__version__
    assert info["License-Expression"] == "BSD-3-Clause"
    assert info.get_all("License-File") == ["docs/LICENSE"]
    classifiers = info.get_all("Classifier")
    assert not [c for c in classifiers if c.startswith("License ::")]  # superseded
    assert {"Framework :: Django :: 5.2", "Framework :: Django :: 6.1"} <= set(classifiers)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DJCB_SDIST_INSTALL") != "1",
                    reason="the full sdist check needs PyPI and minutes: DJCB_SDIST_INSTALL=1")
def test_the_tests_run_from_the_unpacked_sdist(sdist: Path, tmp_path: Path) -> None:
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (tree,) = tmp_path.iterdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DJCACHEBENCH_ROOT")}

    def run(*argv: str, timeout: float) -> str:
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"{argv}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
        return done.stdout

    run(sys.executable, "-m", "venv", ".venv", timeout=120)
    python = str(tree / ".venv" / "bin" / "python")
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "-e", ".[test,bench]", timeout=1200)
    where = run(python, "-c", "import djcachebench; print(djcachebench.__file__)", timeout=60)
    assert Path(where.strip()).is_relative_to(tree)
    out = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FULL_CHECK_TESTS,
              timeout=1200)
    assert " passed" in out and " failed" not in out, out[-3000:]
