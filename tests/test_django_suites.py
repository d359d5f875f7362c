"""Django's own test suites pass on both backends (the runner: ``tests/django_suites.py``).

Pinned: with the Django tests of the installed Django version (fetched from its
sdist on PyPI, cached under ``$DJCB_CACHE_DIR`` or ``~/.cache/djcachebench``),
``BaseCacheTests`` applied to the backend, the cache middleware / utils / i18n /
template-response tests of ``cache/tests.py``, the ``{% cache %}`` tag tests and
the ``cache`` / ``cached_db`` session tests all pass on ShardedSQLiteCache (with
the default shard count, one shard and sixteen) and on TieredCache over a
ShardedSQLiteCache alias, and no test got a LocMemCache. A test Django skips is
allowed but printed.

The same runs under Django 6.1, in the virtualenv ``tests/run.sh`` makes for it
(``.venv-django6``: Django 6 needs Python >= 3.12, and the main virtualenv may
be older); where there is none (no Python >= 3.12, no PyPI), those runs are
skipped with the reason. The runs are mostly waiting (the tests sleep to see
values expire: about 1 s of CPU in 20 s), so all of them run at once, each in
its own process: together they take about as long as the slowest.

Also pinned: the sdist is fetched once and reused, and processes that fetch it
at the same time get one complete tree.
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import django_suites
from tests.django_suites import LOCMEM, REPO, SQLITE, TIERED

# One run takes well under a minute on an idle machine; the bound only stops a hang.
RUN_DEADLINE = 900
# (backend, SHARDS or None for the default) of each run under the installed Django.
CONFIGURATIONS = {"sqlite": ("sqlite", None), "sqlite-shards-1": ("sqlite", 1),
                  "sqlite-shards-16": ("sqlite", 16), "tiered": ("tiered", None)}
DJANGO6 = "django6.1-"
# Each configuration again under Django 6.1 (DJANGO6 + name).
RUNS = {**CONFIGURATIONS, **{DJANGO6 + name: conf for name, conf in CONFIGURATIONS.items()}}


def django6_python() -> tuple[str | None, str]:
    """The interpreter of the Django 6.1 virtualenv, or None and why there is none.

    ``tests/run.sh`` makes it and names it in ``DJCB_DJANGO6_PYTHON`` (or says in
    ``DJCB_DJANGO6_SKIPPED`` why it could not); run directly, pytest takes the
    checkout's ``.venv-django6`` if there is one.
    """
    skipped = os.environ.get("DJCB_DJANGO6_SKIPPED")
    if skipped:
        return None, f"Django 6.1 suites skipped: {skipped}"
    python = os.environ.get("DJCB_DJANGO6_PYTHON") or str(REPO / ".venv-django6/bin/python")
    if not os.access(python, os.X_OK):
        return None, (f"Django 6.1 suites skipped: no {python} (sh tests/run.sh makes it, "
                      f"with a Python >= 3.12)")
    return python, ""


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every run of ``RUNS`` that can run here, started together; values are
    (process, report path, log path)."""
    # A failure to fetch Django's tests fails, never skips.
    interpreters = {"": (sys.executable, django_suites.fetch_django_tests())}
    python6, _ = django6_python()
    if python6 is not None:
        version = django_suites.django_version(python6)
        assert version.startswith("6.1"), f"{python6} has Django {version}, not 6.1"
        download = functools.partial(django_suites.pip_download, python=python6)
        interpreters[DJANGO6] = (python6, django_suites.fetch_django_tests(
            version, download=download))
    runs: dict[str, Any] = {}
    try:
        for prefix, (python, tests_dir) in interpreters.items():
            for name, (backend, shards) in CONFIGURATIONS.items():
                work = tmp_path_factory.mktemp(f"django-suites-{prefix}{name}")
                report, log = work / "report.json", work / "output.log"
                process = django_suites.start(backend, tests_dir, work / "caches", report, log,
                                              shards, python)
                runs[prefix + name] = (process, report, log)
        yield runs
    finally:
        for process, _, _ in runs.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.conformance
@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_django_suites_pass(run: str, suite_runs: dict[str, Any],
                            capsys: pytest.CaptureFixture[str]) -> None:
    if run.startswith(DJANGO6) and run not in suite_runs:
        pytest.skip(django6_python()[1])
    backend = RUNS[run][0]
    process, report_path, log = suite_runs[run]
    process.wait(timeout=RUN_DEADLINE)
    output = log.read_text(errors="replace")
    assert report_path.exists(), f"the run wrote no report (exit {process.returncode}):\n" \
                                 f"{output[-6000:]}"
    report = json.loads(report_path.read_text())
    with capsys.disabled():  # the counts belong in every run's output, not only on failure
        print(f"\n{django_suites.summary_line(report)}")
        for test_id, reason in report["skipped"].items():
            print(f"  skipped by Django: {test_id}: {reason}")
        for test_id in report.get("retried", {}):
            print(f"  failed once, passed when run again on its own: {test_id}")
    details = "\n\n".join(f"{t}:\n{d}" for t, d in report["failed"].items())
    assert report["failed"] == {}, f"{len(report['failed'])} Django tests failed:\n\n" \
                                   f"{details[-12000:]}"
    assert process.returncode == 0, output[-6000:]
    if run.startswith(DJANGO6):
        assert report["django"].startswith("6.1."), report["django"]
    # Every selected class ran, and ran against our backend (never Django's locmem).
    assert report["missing_classes"] == []
    assert set(report["classes"]) == set(report["per_class"])
    assert all(sum(c.values()) > 0 for c in report["per_class"].values())
    assert LOCMEM not in report["built"]
    assert SQLITE in report["built"]
    assert (TIERED in report["built"]) is (backend == "tiered")
    # Every store was written with the shard count this run is about.
    manifests = list((report_path.parent / "caches").glob("*/manifest.json"))
    assert manifests
    shards = RUNS[run][1] or 8
    assert {json.loads(m.read_text())["shards"] for m in manifests} == {shards}


# -- fetching the Django tests ------------------------------------------------------


def fake_sdist(version: str) -> bytes:
    """A tiny stand-in for Django's sdist: ``django-<version>/tests/...`` and a file outside."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in [("tests/runtests.py", "# runner\n"),
                           ("tests/cache/tests.py", "# cache tests\n"),
                           ("django/__init__.py", "# not a test\n")]:
            data = text.encode()
            info = tarfile.TarInfo(f"django-{version}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class FakePip:
    """Counts downloads; each one is slow, so that racing fetchers overlap."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, requirement: str, dest: Path) -> None:
        self.calls.append(requirement)
        time.sleep(0.3)
        version = requirement.split("==")[1]
        (dest / f"django-{version}.tar.gz").write_bytes(fake_sdist(version))


def test_fetch_downloads_once_and_racing_fetchers_share_one_tree(tmp_path: Path) -> None:
    pip = FakePip()
    found: list[Path] = []

    def fetch() -> None:
        found.append(django_suites.fetch_django_tests("9.9", root=tmp_path, download=pip))

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    tests = tmp_path / "django-9.9" / "tests"
    assert pip.calls == ["django==9.9"]
    assert found == [tests] * 4
    assert (tests / "cache" / "tests.py").read_text() == "# cache tests\n"
    assert not (tests.parent / "django").exists()  # only tests/ is extracted
    assert sorted(p.name for p in tests.parent.iterdir()) == [
        ".lock", "django-9.9.tar.gz", "tests"]  # no temporary directories left
    # Reused: neither downloaded nor extracted again.
    (tests / "cache" / "tests.py").write_text("# kept\n")
    assert django_suites.fetch_django_tests("9.9", root=tmp_path, download=pip) == tests
    assert pip.calls == ["django==9.9"]
    assert (tests / "cache" / "tests.py").read_text() == "# kept\n"


def test_fetch_replaces_an_incomplete_tree_from_the_kept_sdist(tmp_path: Path) -> None:
    base = tmp_path / "django-9.9"
    (base / "tests" / "cache").mkdir(parents=True)
    (base / "django-9.9.tar.gz").write_bytes(fake_sdist("9.9"))
    pip = FakePip()
    tests = django_suites.fetch_django_tests("9.9", root=tmp_path, download=pip)
    assert pip.calls == []
    assert (tests / "runtests.py").is_file() and (tests / "cache" / "tests.py").is_file()


def test_cache_directory_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DJCB_CACHE_DIR", str(tmp_path))
    assert django_suites.cache_root() == tmp_path
    monkeypatch.delenv("DJCB_CACHE_DIR")
    assert django_suites.cache_root() == Path.home() / ".cache" / "djcachebench"


def test_retarget_keeps_stores_apart_and_settings_with_them(tmp_path: Path) -> None:
    """Locmem stores named apart stay apart, every other setting stays with its alias,
    and for TieredCache the alias's settings move to the L2 alias it reads through."""
    caches = {
        "default": {"BACKEND": LOCMEM},
        "other": {"BACKEND": LOCMEM, "LOCATION": "other", "TIMEOUT": "1", "KEY_PREFIX": "p"},
        "dummy": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
    }
    sqlite = django_suites.Retarget("sqlite", tmp_path).apply(json.loads(json.dumps(caches)))
    assert sqlite["dummy"] == caches["dummy"]
    assert sqlite["other"]["BACKEND"] == SQLITE
    assert (sqlite["other"]["TIMEOUT"], sqlite["other"]["KEY_PREFIX"]) == ("1", "p")
    assert sqlite["default"]["LOCATION"] != sqlite["other"]["LOCATION"]
    tiered = django_suites.Retarget("tiered", tmp_path).apply(json.loads(json.dumps(caches)))
    assert tiered["other"] == {"BACKEND": TIERED, "OPTIONS": {"L2": "other:l2"}}
    assert tiered["other:l2"] == sqlite["other"]
    assert django_suites.Retarget("tiered", tmp_path).apply(dict(tiered)) == tiered
