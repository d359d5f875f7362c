"""Benchmark targets: what each compared backend is and what it needs.

A target is defined in its own small file in the repository's ``backends/``
directory (``backends/redis.py`` defines ``TARGET = Target(...)``). Why files
and not a table in this module: the definitions are what a reader of the
published results checks first ("which settings did redis run with?"), and
adding a peer should be a new file, not a change to the engine. The files are
loaded by path (see :mod:`djcachebench.bench.paths` for where they are found).

A target's ``caches`` builds its ``CACHES`` entry from a :class:`TargetEnv`
(a fresh temp dir for this target, the locations of the started servers), so
each backend gets clean storage and the real server addresses of this run.
The result is plain data: it is passed to the worker processes as an explicit
argument and recorded verbatim in ``results.json``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from djcachebench.bench.paths import backends_dir
from djcachebench.serializers import SHORT_NAMES, load_serializer

#: The key-count limit of the reference workload, for backends that have one.
#: Django documents CULL_FREQUENCY as "1/N of entries culled when full".
KEY_LIMIT: dict[str, int] = {"MAX_ENTRIES": 1000, "CULL_FREQUENCY": 10}

#: Server kinds a target may need (started by djcachebench.bench.servers).
SERVER_KINDS = ("memcached", "redis")


@dataclass(frozen=True)
class TargetEnv:
    """What a target's definition may use to build its settings."""

    workdir: Path
    servers: Mapping[str, str] = field(default_factory=dict)
    #: The scenario's entry limit (``Scenario.entry_limit()``), for targets that have one.
    max_entries: int = KEY_LIMIT["MAX_ENTRIES"]

    def key_limit(self) -> dict[str, int]:
        """``OPTIONS`` entries for a backend with Django's ``MAX_ENTRIES``/``CULL_FREQUENCY``.

        Every target with a key-count limit takes it from here, so that a
        scenario's ``max_entries`` reaches all of them alike.
        """
        return {**KEY_LIMIT, "MAX_ENTRIES": self.max_entries}

    def server(self, kind: str) -> str:
        """The Django LOCATION of the started server ``kind``."""
        try:
            return self.servers[kind]
        except KeyError:
            raise LookupError(f"no {kind} server was started for this target") from None


@dataclass(frozen=True)
class Target:
    """One compared backend.

    ``caches(env)`` returns the ``CACHES`` entry; ``settings(env)`` any other
    Django settings it needs (e.g. ``DATABASES``); ``setup_commands`` are
    management commands run once before the pre-fill (``createcachetable``).
    ``modules`` are imported before the run: a missing one skips the target.
    ``note`` is printed with the results (e.g. "no key-count limit").
    """

    name: str
    description: str
    caches: Callable[[TargetEnv], dict[str, Any]]
    servers: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    note: str = ""
    settings: Callable[[TargetEnv], dict[str, Any]] | None = None
    setup_commands: tuple[str, ...] = ()
    rank: int = 100
    #: Why this target cannot run as asked (a serializer its backend lacks), or "".
    unsupported: str = ""
    #: A cache private to each process (LocMemCache is recognised by its BACKEND
    #: too): its answers made stale by other processes' writes are reported, not
    #: a failure (freshness.py).
    per_process: bool = False
    #: With simulated hosts: seconds after another host's acknowledged write from
    #: which this cache promises to return that value or a later one (a read
    #: sooner may be stale without being held against it; freshness.py).
    host_bound: float = 0.0
    #: The most distinct keys this target is run with, and why no more (a
    #: scenario over more keys skips it with that reason); None: no bound.
    max_keys: int | None = None
    max_keys_reason: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.servers) - set(SERVER_KINDS)
        if unknown:
            raise ValueError(f"target {self.name}: unknown server kind(s) {sorted(unknown)}")

    def django_settings(self, env: TargetEnv) -> dict[str, Any]:
        """Everything a worker passes to ``settings.configure()`` (cache alias 'default')."""
        extra = self.settings(env) if self.settings else {}
        return {"CACHES": {"default": self.caches(env)}, **extra}

    def too_many_keys(self, keys: int) -> str | None:
        """The skip reason when a scenario's ``keys`` exceed what this target holds."""
        if self.max_keys is None or keys <= self.max_keys:
            return None
        return f"cannot hold {keys:,} keys (at most {self.max_keys:,} here): {self.max_keys_reason}"

    def missing_module(self) -> str | None:
        """The skip reason when a required module cannot be imported, else None."""
        for module in self.modules:
            reason = importable(module)
            if reason:
                return reason
        return None


class TargetError(ValueError):
    """A target definition is broken, or a requested target does not exist."""


def importable(module: str) -> str | None:
    """None when ``module`` imports, else the skip reason.

    Only import failures count: a module that imports but fails for another
    reason (settings needed at import time) is left to the worker to report.
    """
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"module not importable: {module} ({exc})"
    except Exception:
        return None
    return None


def resolvable(dotted: str) -> str | None:
    """None when the class ``module.Class`` exists, else the skip reason."""
    module_name, _, attr = dotted.rpartition(".")
    reason = importable(module_name)
    if reason:
        return reason
    module = sys.modules.get(module_name)
    if module is not None and not hasattr(module, attr):
        return f"module not importable: {dotted} ({module_name} has no {attr!r})"
    return None


def is_per_process(entry: Mapping[str, Any]) -> bool:
    """Is the cache of this ``CACHES`` entry Django's LocMemCache, private to each
    process by design (so held to its own process's writes only: freshness.Scope)?"""
    return entry.get("BACKEND") == "django.core.cache.backends.locmem.LocMemCache"


def backend_paths(settings: Mapping[str, Any]) -> Iterator[str]:
    """Every ``BACKEND`` dotted path in a settings dict, nested ones (an inline L2) too."""
    for key, value in settings.items():
        if key == "BACKEND" and isinstance(value, str):
            yield value
        elif isinstance(value, Mapping):
            yield from backend_paths(value)


def load_targets(directory: Path | None = None) -> list[Target]:
    """Every ``TARGET`` defined in ``directory`` (default ``backends/``), in rank order."""
    directory = directory or backends_dir()
    targets: dict[str, Target] = {}
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        target = _load_file(path)
        if target.name in targets:
            raise TargetError(f"target {target.name!r} is defined twice (again in {path})")
        targets[target.name] = target
    if not targets:
        raise TargetError(f"no target definitions (*.py defining TARGET) in {directory}")
    return sorted(targets.values(), key=lambda t: (t.rank, t.name))


def select_targets(targets: list[Target], names: list[str] | None) -> list[Target]:
    """The targets named in ``names`` (all when None), in rank order, each once.

    An empty list is an error, not "all": ``--backends ,`` named no target.
    """
    if names is None:
        return targets
    if not names:
        raise TargetError("no target named (an empty list); see `djcachebench list`")
    by_name = {t.name: t for t in targets}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise TargetError(f"unknown target(s) {unknown}; available: {', '.join(by_name)}")
    wanted = set(names)
    return [t for t in targets if t.name in wanted]


#: How a backend takes a serializer: (OPTIONS key, short name -> its value).
#: A dotted path is given as it is to backends with djcachebench's interface
#: (``dumps``/``loads``, no arguments); django-redis constructs its serializers
#: with its own options, so it takes only the short names it ships.
SERIALIZER_OPTIONS: dict[str, tuple[str, dict[str, str] | None]] = {
    "djcachebench.backends.sqlite.ShardedSQLiteCache": ("SERIALIZER", None),
    "django_redis.cache.RedisCache": (
        "SERIALIZER",
        {
            "pickle": "django_redis.serializers.pickle.PickleSerializer",
            "msgpack": "django_redis.serializers.msgpack.MSGPackSerializer",
        },
    ),
}
#: What every backend without a serializer option does: it pickles.
DEFAULT_SERIALIZER = "pickle"


class SerializerUnsupported(ValueError):
    """A backend cannot store values with the asked serializer."""


def apply_serializer(entry: dict[str, Any], serializer: str) -> dict[str, Any]:
    """A copy of a CACHES entry whose backend (or inline L2) uses ``serializer``.

    Raises :class:`SerializerUnsupported` when no backend in the entry takes it
    (a backend without the option pickles, so ``pickle`` is always accepted).
    """
    applied = False

    def walk(node: dict[str, Any]) -> dict[str, Any]:
        nonlocal applied
        out = {k: walk(v) if isinstance(v, dict) else v for k, v in node.items()}
        known = SERIALIZER_OPTIONS.get(str(out.get("BACKEND")))
        if known:
            option, names = known
            value = serializer if names is None else names.get(serializer)
            if value is None:
                raise SerializerUnsupported(
                    f"{out['BACKEND']} takes only the serializers {sorted(names or {})}, "
                    f"not {serializer!r}"
                )
            out["OPTIONS"] = {**out.get("OPTIONS", {}), option: value}
            applied = True
        return out

    result = walk(entry)
    if not applied and serializer != DEFAULT_SERIALIZER:
        raise SerializerUnsupported(f"{entry.get('BACKEND')} has no serializer option (it pickles)")
    return result


def serializer_variant(target: Target, serializer: str) -> Target:
    """``sqlite[msgpack]``: the target with its backend's serializer set.

    A backend that cannot take the serializer gives a variant that is skipped
    with the reason, so the report says which combinations did not run.
    """
    name = f"{target.name}[{serializer.rpartition('.')[2]}]"
    probe = TargetEnv(Path("/nonexistent"), {kind: "probe" for kind in SERVER_KINDS})
    unsupported = target.unsupported
    try:
        apply_serializer(target.caches(probe), serializer)
    except SerializerUnsupported as exc:
        unsupported = unsupported or str(exc)
    modules = target.modules
    if serializer == "msgpack":
        modules = (*modules, "msgpack")
    elif serializer != DEFAULT_SERIALIZER and "." in serializer:
        modules = (*modules, serializer.rpartition(".")[0])
    caches = target.caches

    def with_serializer(env: TargetEnv) -> dict[str, Any]:
        return apply_serializer(caches(env), serializer)

    return replace(
        target,
        name=name,
        description=f"{target.description}, serializer {serializer}",
        caches=with_serializer,
        modules=modules,
        unsupported=unsupported,
    )


def check_serializer_name(name: str) -> None:
    """Raise :class:`TargetError` for a serializer no worker could load.

    Checked before any target starts: a misspelt name would otherwise fail in
    every worker and read as a broken backend (exit 1) instead of a usage error.
    A short name whose library is missing is not an error: its variants are
    skipped for the missing module, as other targets' are.
    """
    if name in SHORT_NAMES:
        return
    try:
        load_serializer(name)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise TargetError(
            f"--serializer {name!r} cannot be loaded ({exc}); allowed: "
            f"{', '.join(SHORT_NAMES)} or a dotted path to a class with dumps()/loads()"
        ) from exc


def serializer_variants(targets: list[Target], serializers: list[str] | None) -> list[Target]:
    """Every target with every serializer (target by target), or the targets as they are.

    A serializer named twice runs once: two runs under one variant's name would
    merge into fake repeats of it.
    """
    if not serializers:
        return targets
    unique = list(dict.fromkeys(serializers))
    for name in unique:
        check_serializer_name(name)
    return [serializer_variant(t, s) for t in targets for s in unique]


def _load_file(path: Path) -> Target:
    module_name = f"djcachebench_targets.{path.stem.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load target definition {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise TargetError(f"target definition {path} failed to load: {exc}") from exc
    target = getattr(module, "TARGET", None)
    if not isinstance(target, Target):
        raise TargetError(f"{path} must define TARGET = Target(...)")
    return target
