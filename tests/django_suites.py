"""Django's own test suites, run against this project's cache backends.

Why: the backends claim to be drop-in Django caches, and the best judge of
that is the test suite Django applies to its own backends. Django's tests are
not shipped in its wheel, so the sdist matching the installed Django is
fetched from PyPI with pip at test time, cached, and its ``tests/`` tree
extracted (see :func:`fetch_django_tests`).

What runs, in one process per backend (``python -m tests.django_suites
--backend sqlite|tiered [--shards N]``), with Django's test runner:

* ``cache/tests.py``: ``BaseCacheTests`` applied to the backend the way
  Django applies it to its own backends
  (``override_settings(CACHES=caches_setting_for_tests(...))``, every alias on
  one store), and the middleware / utils / i18n / template-response classes of
  that module (:data:`CACHE_CLASSES`);
* ``template_tests/syntax_tests/test_cache.py`` (the ``{% cache %}`` tag);
* the cache-backed session tests of ``sessions_tests`` (the ``cache`` and
  ``cached_db`` engines).

Those tests configure ``LocMemCache``; every ``LocMemCache`` they configure
(class or method ``override_settings``, or the base settings) is built as the
backend under test instead (:class:`Retarget`): one store per locmem
``LOCATION``, the alias's other settings kept, so separate locmem stores stay
separate and shared ones shared. Other backends a test names on purpose
(``DummyCache``, Django's failing test cache) are left alone. For ``tiered``,
each alias becomes a ``TieredCache`` whose ``L2`` is a ShardedSQLiteCache
alias of its own (``<alias>:l2``) carrying the alias's settings.

The settings are those Django's own test-suite runner sets up for these apps
(installed apps, middleware, templates, URLconf, in-memory SQLite, warnings
turned into errors). The outcome of every test is written to a JSON report;
the process exits 1 if a test failed or errored.

A test that fails is run once more, on its own, after the suites (at most
:data:`RETRY_AT_MOST` of them): some of Django's tests measure time (a page
cached for 3 s must still be served after ``time.sleep(2)``), and on a loaded
machine the second between them is lost. A test that passes the second time
counts as passed and is listed under ``retried`` with its first failure; one
that fails twice fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

SQLITE = "djcachebench.backends.sqlite.ShardedSQLiteCache"
TIERED = "djcachebench.backends.tiered.TieredCache"
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
BACKENDS = ("sqlite", "tiered")
L2_SUFFIX = ":l2"
REPO = Path(__file__).resolve().parents[1]

# Classes of cache/tests.py run besides BaseCacheTests: Django runs them on
# locmem only, but they exercise a cache through Django's middleware, cache
# utilities, i18n keys and template responses. Those missing from the Django
# version at hand are reported, not run.
CACHE_CLASSES = (
    "CacheUtils", "PrefixedCacheUtils", "CacheHEADTest", "CacheI18nTest",
    "PrefixedCacheI18nTest", "CacheMiddlewareTest", "TestWithTemplateResponse",
)
SESSION_CLASSES = ("CacheSessionTests", "CacheDBSessionTests",
                   "CacheDBSessionWithTimeZoneTests")
TEMPLATE_MODULE = "template_tests.syntax_tests.test_cache"
# The packages of Django's tests/ that its runner installs as apps for these suites.
TEST_APPS = ["cache", "sessions_tests", "template_tests"]


# -- the Django sdist --------------------------------------------------------------


def cache_root() -> Path:
    """``$DJCB_CACHE_DIR``, else ``~/.cache/djcachebench``: where sdists are kept between runs."""
    configured = os.environ.get("DJCB_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "djcachebench"


def pip_download(requirement: str, dest: Path, python: str = sys.executable) -> None:
    """Download the sdist of ``requirement`` into ``dest`` (no wheel, no dependencies),
    with the pip of ``python`` (whose version the sdist's Requires-Python must admit)."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "--quiet", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout}{proc.stderr}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``: one fetcher at a time per Django version."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_django_tests(version: str | None = None, root: Path | None = None,
                       download: Callable[[str, Path], None] = pip_download) -> Path:
    """The ``tests/`` directory of Django ``version``'s sdist (default: the installed one).

    Kept under ``root/django-<version>/``: reused when present, otherwise
    downloaded and extracted. Processes that race take turns on a lock file,
    and both the sdist and the tree are moved into place whole (a rename), so
    an interrupted fetch never leaves a half tree that a later run would trust.
    """
    if version is None:
        import django

        version = django.__version__
    base = (root or cache_root()) / f"django-{version}"
    tests = base / "tests"
    if (tests / "runtests.py").is_file():
        return tests
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / ".lock"):
        if (tests / "runtests.py").is_file():  # another process finished meanwhile
            return tests
        if tests.exists():  # not ours to trust: no complete tree is ever there without it
            shutil.rmtree(tests)
        sdist = next(iter(sorted(base.glob("[Dd]jango-*.tar.gz"))), None)
        if sdist is None:
            with tempfile.TemporaryDirectory(dir=base, prefix=".download-") as tmp:
                download(f"django=={version}", Path(tmp))
                found = sorted(Path(tmp).glob("[Dd]jango-*.tar.gz"))
                if not found:
                    got = [f.name for f in Path(tmp).iterdir()]
                    raise RuntimeError(f"pip gave no Django {version} sdist, only {got}")
                sdist = base / found[0].name
                os.replace(found[0], sdist)
        with tempfile.TemporaryDirectory(dir=base, prefix=".extract-") as tmp:
            _extract_tests(sdist, Path(tmp))
            os.replace(Path(tmp) / "tests", tests)
    return tests


def _extract_tests(sdist: Path, dest: Path) -> None:
    """Extract ``<top>/tests/**`` of ``sdist`` as ``dest/tests`` (data members only)."""
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            parts = member.name.split("/", 2)
            if len(parts) >= 2 and parts[1] == "tests" and (member.isfile() or member.isdir()):
                member.name = "/".join(parts[1:])
                members.append(member)
        if not any(m.name == "tests/runtests.py" for m in members):
            raise RuntimeError(f"{sdist} has no tests/runtests.py")
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Pythons without extraction filters
            archive.extractall(dest, members=members)


# -- CACHES: LocMemCache -> the backend under test ------------------------------------


class Retarget:
    """Rewrites a ``CACHES`` dict in place so its LocMemCaches are the backend under test.

    Idempotent (a rewritten entry is no longer a LocMemCache), so it can run
    every time ``CACHES`` changes, on dicts it has seen before.
    """

    def __init__(self, backend: str, root: Path, shards: int | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.backend = backend
        self.root = root
        self.options = {} if shards is None else {"SHARDS": shards}

    def sqlite(self, conf: Mapping[str, Any], location: str) -> dict[str, Any]:
        """``conf`` as a ShardedSQLiteCache on ``location`` (its other settings kept)."""
        options = {**self.options, **(conf.get("OPTIONS") or {})}
        return {**conf, "BACKEND": SQLITE, "LOCATION": location,
                **({"OPTIONS": options} if options else {})}

    def store(self, name: str) -> str:
        """The directory standing for the locmem store ``name`` (locmem's LOCATION)."""
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "unnamed"
        digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
        return str(self.root / f"{slug}-{digest}")

    def apply(self, caches: dict[str, Any]) -> dict[str, Any]:
        for alias, conf in list(caches.items()):
            if conf.get("BACKEND") == LOCMEM:
                conf = self.sqlite(conf, self.store(conf.get("LOCATION", "")))
                caches[alias] = conf
            if (self.backend == "tiered" and conf.get("BACKEND") == SQLITE
                    and not alias.endswith(L2_SUFFIX)):
                caches[alias + L2_SUFFIX] = conf
                caches[alias] = {"BACKEND": TIERED, "OPTIONS": {"L2": alias + L2_SUFFIX}}
        return caches

    def base_cache_tests_caches(self, module: Any) -> dict[str, Any]:
        """The CACHES Django gives ``BaseCacheTests`` (``caches_setting_for_tests``),
        every alias on one store, as for its file-based and server backends."""
        location = str(self.root / "base-cache-tests")
        caches = module.caches_setting_for_tests(base={"BACKEND": SQLITE, "LOCATION": location})
        # Django's helper replaces OPTIONS wholesale ('cull' has only MAX_ENTRIES):
        # the run's own options are merged back into every alias.
        return self.apply({alias: self.sqlite(conf, location) for alias, conf in caches.items()})


# -- Django settings, as Django's own test-suite runner sets them ------------------


def runtests_settings(tests_dir: Path, root: Path, caches: dict[str, Any]) -> dict[str, Any]:
    """The SQLite test settings of Django's suite, plus what its runner sets before
    running test modules (apps, URLconf, templates, middleware), for these suites."""
    from django.utils.log import DEFAULT_LOGGING

    logging = copy.deepcopy(DEFAULT_LOGGING)
    logging["loggers"]["django"]["level"] = "ERROR"
    return {
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3"},
                      "other": {"ENGINE": "django.db.backends.sqlite3"}},
        "SECRET_KEY": "django_tests_secret_key",
        "PASSWORD_HASHERS": ["django.contrib.auth.hashers.MD5PasswordHasher"],
        "DEFAULT_AUTO_FIELD": "django.db.models.AutoField",
        "USE_TZ": False,
        "INSTALLED_APPS": [
            "django.contrib.contenttypes", "django.contrib.auth", "django.contrib.sites",
            "django.contrib.sessions", "django.contrib.messages",
            "django.contrib.admin.apps.SimpleAdminConfig", "django.contrib.staticfiles",
            *TEST_APPS,
        ],
        "ROOT_URLCONF": "urls",
        "STATIC_URL": "static/",
        "STATIC_ROOT": str(root / "static"),
        "TEMPLATES": [{
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [str(tests_dir / "templates")],
            "APP_DIRS": True,
            "OPTIONS": {"context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]},
        }],
        "LANGUAGE_CODE": "en",
        "SITE_ID": 1,
        "MIDDLEWARE": [
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        "MIGRATION_MODULES": {"auth": None, "contenttypes": None, "sessions": None},
        "LOGGING": logging,
        "SILENCED_SYSTEM_CHECKS": ["fields.W342"],
        "CACHES": caches,
    }


def strict_warnings() -> None:
    """As Django's own suite runs: its deprecations, ResourceWarning and RuntimeWarning
    are errors, so a backend that leaks a file or a connection fails."""
    import django.utils.deprecation as deprecation

    for name in dir(deprecation):
        if name.startswith("RemovedInDjango") and name.endswith("Warning"):
            warnings.simplefilter("error", getattr(deprecation, name))
    warnings.simplefilter("error", ResourceWarning)
    warnings.simplefilter("error", RuntimeWarning)


# -- outcomes --------------------------------------------------------------------------


class RecordingResult(unittest.TextTestResult):
    """unittest's text result that also keeps each test's outcome for the report.

    (The ``addX`` names are unittest's API.) A test counts once, with its worst
    outcome: a failing subtest fails its test.
    """

    RANK = {"passed": 0, "skipped": 1, "failed": 2}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, tuple[str, str]] = {}

    def _record(self, test: Any, outcome: str, detail: str = "") -> None:
        case = getattr(test, "test_case", test)  # a subtest counts for its test
        key = case.id()
        if key not in self.outcomes or self.RANK[outcome] > self.RANK[self.outcomes[key][0]]:
            self.outcomes[key] = (outcome, detail)

    def _trace(self, err: Any, test: Any) -> str:
        return self._exc_info_to_string(err, test)[-4000:]

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self._record(test, "passed")

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "failed", self._trace(err, test))

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", self._trace(err, test))

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._record(subtest, "failed", f"{subtest.id()}\n{self._trace(err, test)}")

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def summarize(outcomes: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """Counts overall and per test class, and the details of what did not pass."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    per_class: dict[str, dict[str, int]] = {}
    for test_id, (outcome, _) in outcomes.items():
        counts[outcome] += 1
        cls = test_id.rsplit(".", 1)[0] if " " not in test_id else test_id
        per_class.setdefault(cls, {"passed": 0, "failed": 0, "skipped": 0})[outcome] += 1
    return {
        "counts": counts,
        "per_class": dict(sorted(per_class.items())),
        "failed": {t: d for t, (o, d) in sorted(outcomes.items()) if o == "failed"},
        "skipped": {t: d for t, (o, d) in sorted(outcomes.items()) if o == "skipped"},
    }


def summary_line(report: Mapping[str, Any]) -> str:
    c = report["counts"]
    return (f"Django {report['django']} suites on {report['backend']}: {c['passed']} passed, "
            f"{c['failed']} failed, {c['skipped']} skipped ({report['elapsed']:.0f} s)")


# -- the run (inside the child process) -------------------------------------------------


#: More failures than this are not retried: that is a broken backend, not a slow machine.
RETRY_AT_MOST = 5


def run(backend: str, tests_dir: Path, location: Path, report_path: Path | None,
        verbosity: int = 1, patterns: list[str] | None = None, shards: int | None = None) -> int:
    """Configure Django as its own suite does, run the suites, write the report; 0 if all
    passed (and no test got a LocMemCache)."""
    started = time.monotonic()
    sys.path.insert(0, str(tests_dir))
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    os.environ["RUNNING_DJANGOS_TEST_SUITE"] = "true"
    strict_warnings()
    import django
    from django.conf import settings
    from django.test.runner import DiscoverRunner
    from django.test.signals import setting_changed

    retarget = Retarget(backend, location, shards)
    settings.configure(**runtests_settings(tests_dir, location, retarget.apply(
        {"default": {"BACKEND": LOCMEM}})))
    django.setup()

    def on_change(*, setting: str, **_: Any) -> None:
        if setting == "CACHES":  # before any cache of the new setting is built
            retarget.apply(settings.CACHES)

    setting_changed.connect(on_change, weak=False)
    # Which backends the tests really got: a LocMemCache here would mean a
    # test ran against Django's cache instead of ours.
    from django.core.cache import caches

    built: Counter[str] = Counter()
    create = caches.create_connection

    def create_connection(alias: str) -> Any:
        backend = create(alias)
        built[f"{type(backend).__module__}.{type(backend).__qualname__}"] += 1
        return backend

    caches.create_connection = create_connection  # type: ignore[method-assign]

    classes, missing = select_classes(retarget)
    by_label = {f"{c.__module__}.{c.__qualname__}": c for c in classes}

    class Runner(DiscoverRunner):
        result: RecordingResult

        def load_tests_for_label(self, label: str, discover_kwargs: Any) -> Any:
            with self.load_with_patterns():
                return self.test_loader.loadTestsFromTestCase(by_label[label])

        def get_resultclass(self) -> type[RecordingResult]:
            return RecordingResult

        def run_suite(self, suite: Any, **kwargs: Any) -> Any:
            self.result = super().run_suite(suite, **kwargs)
            return self.result

    runner = Runner(verbosity=verbosity, interactive=False, test_name_patterns=patterns)
    runner.run_tests(list(by_label))
    outcomes = dict(runner.result.outcomes)
    retried: dict[str, str] = {}
    failed = [t for t, (outcome, _) in outcomes.items() if outcome == "failed"]
    if 0 < len(failed) <= RETRY_AT_MOST:
        # A subtest's id is its test's id and a description in parentheses.
        tests = sorted({t.split(" ", 1)[0] for t in failed})
        again = Runner(verbosity=verbosity, interactive=False,
                       test_name_patterns=[".".join(t.split(".")[-2:]) for t in tests])
        again.run_tests(sorted({label for label in by_label
                                if any(t.startswith(label + ".") for t in tests)}))
        second = again.result.outcomes
        for test_id in failed:
            base = test_id.split(" ", 1)[0]
            if second.get(base, ("failed",))[0] == "passed" and not any(
                    t.startswith(base + " ") and o == "failed" for t, (o, _) in second.items()):
                retried[test_id] = outcomes[test_id][1]
                outcomes[test_id] = ("passed", "")
    report = {
        "backend": backend if shards is None else f"{backend} (SHARDS={shards})",
        "django": django.get_version(),
        "tests_dir": str(tests_dir),
        "classes": list(by_label),
        "missing_classes": missing,
        "elapsed": time.monotonic() - started,
        "built": dict(built),
        **summarize(outcomes),
        "retried": retried,
    }
    if report_path is not None:
        report_path.write_text(json.dumps(report, indent=1))
    print_report(report)
    ran = sum(report["counts"].values())
    return 0 if ran and not report["failed"] and LOCMEM not in built else 1


def select_classes(retarget: Retarget) -> tuple[list[type], list[str]]:
    """The test classes to run (``BaseCacheTests`` applied to the backend first), and
    the names of wanted classes this Django version does not have."""
    from django.test import TestCase, override_settings

    cache_tests = importlib.import_module("cache.tests")
    sessions = importlib.import_module("sessions_tests.tests")
    templates = importlib.import_module(TEMPLATE_MODULE)
    name = "ShardedSQLiteCacheTests" if retarget.backend == "sqlite" else "TieredCacheTests"
    applied = type(name, (cache_tests.BaseCacheTests, TestCase),
                   {"__module__": cache_tests.__name__, "__qualname__": name})
    classes: list[type] = [
        override_settings(CACHES=retarget.base_cache_tests_caches(cache_tests))(applied)]
    missing = []
    for module, wanted in ((cache_tests, CACHE_CLASSES), (sessions, SESSION_CLASSES)):
        for cls_name in wanted:
            if hasattr(module, cls_name):
                classes.append(getattr(module, cls_name))
            else:
                missing.append(f"{module.__name__}.{cls_name}")
    classes += [obj for obj in vars(templates).values()
                if isinstance(obj, type) and issubclass(obj, unittest.TestCase)
                and obj.__module__ == templates.__name__]
    return classes, missing


def print_report(report: Mapping[str, Any]) -> None:
    for cls, c in report["per_class"].items():
        print(f"  {cls}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    for test_id, reason in report["skipped"].items():
        print(f"  SKIPPED {test_id}: {reason}")
    for test_id in report["failed"]:
        print(f"  FAILED {test_id}")
    for test_id in report.get("retried", {}):
        print(f"  RETRIED {test_id}: failed once, passed when run again on its own")
    for cls_name in report["missing_classes"]:
        print(f"  not in this Django version: {cls_name}")
    print(f"  backends built: {report['built']}")
    print(summary_line(report))


# -- the parent side ---------------------------------------------------------------------


def django_version(python: str) -> str:
    """The version of the Django that ``python`` imports."""
    done = subprocess.run([python, "-c", "import django; print(django.__version__)"],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def start(backend: str, tests_dir: Path, location: Path, report: Path,
          log: Path, shards: int | None = None,
          python: str = sys.executable) -> subprocess.Popen[bytes]:
    """Start ``run`` for ``backend`` in a child process of ``python`` (a clean
    interpreter: no pytest-django settings; another virtualenv's for another Django),
    its output in ``log``. The repository comes first on the child's path so it
    tests this checkout's ``djcachebench``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [python, "-m", "tests.django_suites", "--backend", backend,
           "--tests-dir", str(tests_dir), "--location", str(location),
           "--report", str(report)]
    if shards is not None:
        cmd += ["--shards", str(shards)]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.django_suites",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--tests-dir", type=Path,
                        help="Django's tests/ (default: fetched for the installed Django)")
    parser.add_argument("--location", type=Path,
                        help="directory for the cache stores (default: a new temporary one)")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--shards", type=int, help="SHARDS of every ShardedSQLiteCache store")
    parser.add_argument("--verbosity", type=int, default=1)
    parser.add_argument("-k", dest="patterns", action="append",
                        help="only tests whose name matches (repeatable)")
    args = parser.parse_args(argv)
    tests_dir = args.tests_dir or fetch_django_tests()
    if args.location is not None:
        return run(args.backend, tests_dir, args.location, args.report, args.verbosity,
                   args.patterns, args.shards)
    with tempfile.TemporaryDirectory(prefix="djcb-django-suites-") as tmp:
        return run(args.backend, tests_dir, Path(tmp), args.report, args.verbosity,
                   args.patterns, args.shards)


if __name__ == "__main__":
    sys.exit(main())
