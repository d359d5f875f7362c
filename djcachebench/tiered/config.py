"""How a TieredCache's settings are read: its OPTIONS, its L2, and how they combine.

Kept apart from the adapter so that the system checks can validate every tiered
alias of ``CACHES`` without building a backend (and so the adapter stays thin).
The table of the OPTIONS themselves is ``options.py``.

How the settings of the tiered alias and of its L2 combine (``docs/settings.md``, TieredCache):

* Keys are the L2's keys. The adapter passes the caller's key and version to
  the L2 unchanged, so ``tiered.get("k")`` and ``caches[l2_alias].get("k")``
  address the same entry and the same generation slot; that is what lets a
  write made directly through the L2 alias invalidate every L1.
* Inline L2 (a dict): the tiered alias's ``KEY_PREFIX``, ``VERSION``,
  ``KEY_FUNCTION``, ``TIMEOUT`` and its ``OPTIONS`` ``MAX_ENTRIES`` /
  ``CULL_FREQUENCY`` are passed into the inline L2, which applies them. Setting
  one on both sides with different values is an error (which would win is not
  obvious). ``TIMEOUT``, ``MAX_ENTRIES`` and ``CULL_FREQUENCY`` are read as
  Django reads them (the legacy lower-case top-level keys ``timeout``,
  ``max_entries``, ``cull_frequency`` first; ``"300"`` and ``300`` the same).
* L2 alias (a string): the L2 alias's settings apply. The tiered alias may
  repeat them with the same value, but a different value is an error: a
  tiered alias with its own prefix would no longer see writes made through
  the L2 alias, and a tiered ``MAX_ENTRIES`` cannot bound a store it shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.cache.backends.base import get_key_func
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from djcachebench.conf import (
    DJANGO_OPTIONS,
    LEGACY_KEYS,
    check_key_function,
    django_source,
    parse_value,
    same_django_value,
)
from djcachebench.stampede import check_early_refresh
from djcachebench.tiered.errors import (
    E_CONFLICT,
    E_CYCLE,
    E_NO_ALIAS,
    E_OPTIONS,
    TieredConfigError,
)
from djcachebench.tiered.locations import coherence_url
from djcachebench.tiered.options import KEY_PARAMS, OPTIONS, PASS_THROUGH_OPTIONS, REQUIRED

BACKEND_PATH = "djcachebench.backends.tiered.TieredCache"
# The settings BaseCache reads with Django's precedence (conf.django_source).
DJANGO_SETTINGS = ("TIMEOUT", *PASS_THROUGH_OPTIONS)
# Django's defaults for the pass-through params (BaseCache.__init__).
_PARAM_DEFAULTS: dict[str, Any] = {
    "KEY_PREFIX": "",
    "VERSION": 1,
    "KEY_FUNCTION": None,
    "TIMEOUT": 300,
}


@dataclass(frozen=True)
class TieredConfig:
    """Everything the adapter needs, validated."""

    where: str  # setting path for messages
    l2_alias: str | None  # None: inline
    l2_backend: str
    l2_location: str
    l2_params: dict[str, Any]  # the L2's params (as Django would pass them)
    l1_max_entries: int
    l1_max_bytes: int | None
    l1_timeout: float | None
    coherence: str
    strict_lease: float | None
    shared_value_bytes: int
    generation_path: str | None
    generation_slots: int
    stampede_lease: float | None  # seconds; None: Django's unprotected get_or_set
    early_refresh: float | None  # XFetch beta; None: off
    breaker_threshold: int | None = None  # consecutive L2 failures; None: no breaker
    breaker_cooldown: float = 1.0  # seconds open before a probe
    serve_stale: float | None = None  # seconds past an L1 expiry, while open
    coherence_url: str | None = None  # COHERENCE="cluster": resolved (default: the L2's redis)


def _caches_setting() -> Mapping[str, Any]:
    from django.conf import settings

    return getattr(settings, "CACHES", {})


def _is_tiered(backend: Any) -> bool:
    if backend == BACKEND_PATH:
        return True
    try:
        cls = import_string(backend)
    except ImportError:
        return False  # Django reports an unimportable BACKEND itself
    return descends_from(cls, BACKEND_PATH)


def descends_from(cls: Any, path: str) -> bool:
    """Is ``cls`` the class at dotted ``path`` or a subclass of it? Told from the
    qualified names of its bases, so that this package need not import the
    backend classes (which import it: they stand above it)."""
    return isinstance(cls, type) and any(
        f"{base.__module__}.{base.__qualname__}" == path for base in cls.__mro__)


def _check_chain(spec: Any, where: str, caches: Mapping[str, Any]) -> None:
    """Follow L2 -> L2 -> ... through tiered caches; raise on a missing alias or a cycle."""
    chain: list[str] = []
    while True:
        if isinstance(spec, str):
            if spec in chain:
                loop = " -> ".join([*chain, spec])
                raise TieredConfigError(
                    f"{where}['L2'] = {chain[0]!r} makes a cycle of tiered caches: {loop}; "
                    "an L2 must end at a cache that is not a TieredCache.", E_CYCLE)
            if spec not in caches:
                known = ", ".join(repr(a) for a in caches) or "none"
                raise TieredConfigError(
                    f"{where}['L2'] = {spec!r} is not an alias of CACHES"
                    f"{f' (reached through {chain[0]!r})' if chain else ''}; "
                    f"aliases defined: {known}.", E_NO_ALIAS)
            chain.append(spec)
            conf = caches[spec]
        elif isinstance(spec, Mapping):
            chain.append("<inline>")
            conf = spec
        else:
            return
        if not _is_tiered(conf.get("BACKEND")):
            return
        spec = (conf.get("OPTIONS") or {}).get("L2")


def _same(name: str, a: Any, b: Any) -> bool:
    if a == b:
        return True
    if name in DJANGO_SETTINGS:
        return same_django_value(name, a, b)
    if name == "KEY_FUNCTION":
        try:
            return get_key_func(a) is get_key_func(b)
        except ImportError:
            return False
    return False


#: This backend's own options: beside BACKEND (where Django reads its own
#: settings) they are an error, not ignored.
_OWN_OPTION_NAMES = frozenset(o.name for o in OPTIONS.options) - {
    *DJANGO_SETTINGS, *KEY_PARAMS}


def _check_django_settings(found: Mapping[str, tuple[str, Any] | None], path: str) -> None:
    """Raise for a value of TIMEOUT, MAX_ENTRIES or CULL_FREQUENCY (``found``:
    django_source's answers) that Django's BaseCache would replace by a guess."""
    for name, where_value in found.items():
        if where_value is not None:
            try:
                parse_value(DJANGO_OPTIONS[name], where_value[1], f"{path}{where_value[0]}")
            except ImproperlyConfigured as exc:
                raise TieredConfigError(str(exc), E_OPTIONS) from exc.__cause__


def read_config(location: str, params: Mapping[str, Any]) -> TieredConfig:
    """Validate a tiered alias's settings; raise ``TieredConfigError`` naming the setting."""
    raw_options = params.get("OPTIONS")
    from djcachebench.conf import setting_path

    where = setting_path(BACKEND_PATH, location, raw_options)
    misplaced = [name for name in params if name in _OWN_OPTION_NAMES]
    if misplaced:
        # Beside BACKEND, Django reads none of them: they would be ignored without a
        # word (L1_MAX_ENTRIES=5 there would run with the default).
        name = misplaced[0]
        raise TieredConfigError(
            f"{where.rsplit('[', 1)[0]}[{name!r}] is not read by TieredCache; "
            f"put it in {where}[{name!r}].", E_OPTIONS)
    try:
        opts = OPTIONS.parse(raw_options, where)
    except TieredConfigError:
        raise
    except ImproperlyConfigured as exc:
        raise TieredConfigError(str(exc), E_OPTIONS) from exc.__cause__
    if location:
        raise TieredConfigError(
            f"{where.rsplit('[', 1)[0]}['LOCATION'] = {location!r} is invalid; allowed: "
            "nothing (a TieredCache has no location; its L2 has one).", E_OPTIONS)
    conflict = check_early_refresh(opts["EARLY_REFRESH"], opts["STAMPEDE_LEASE"], where)
    if conflict is not None:
        raise TieredConfigError(conflict, E_OPTIONS)
    if opts["SERVE_STALE"] is not None and opts["BREAKER_THRESHOLD"] is None:
        raise TieredConfigError(
            f"{where}['SERVE_STALE'] = {opts['SERVE_STALE']!r} needs the circuit breaker "
            f"(stale copies are served only while it is open); allowed with "
            f"{where}['BREAKER_THRESHOLD'] = None: only None.", E_OPTIONS)
    if opts["STRICT_LEASE"] is not None and opts["COHERENCE"] != "cluster":
        raise TieredConfigError(
            f"{where}['STRICT_LEASE'] = {opts['STRICT_LEASE']!r} is invalid with "
            f"COHERENCE={opts['COHERENCE']!r}; allowed: None, or set COHERENCE='cluster' "
            "(strict writes wait for the other hosts).", E_OPTIONS)
    spec = opts["L2"]
    if spec is REQUIRED:
        raise TieredConfigError(
            f"{where}['L2'] is required: {OPTIONS.options[0].allowed}.", E_OPTIONS)
    caches = _caches_setting()
    _check_chain(spec, where, caches)
    alias_path = where.rsplit("[", 1)[0]
    raw_opts: Mapping[str, Any] = raw_options or {}
    # The tiered alias's own Django settings, found where Django looks for them.
    ours = {name: django_source(params, raw_opts, name) for name in DJANGO_SETTINGS}
    our_timeout = ours["TIMEOUT"]
    # Validated here: the L2 may be a backend that guesses (Django's replace what
    # int() refuses by their defaults without a word).
    _check_django_settings(ours, alias_path)
    check_key_function(params.get("KEY_FUNCTION"), f"{alias_path}['KEY_FUNCTION']")
    if isinstance(spec, Mapping):
        check_key_function(spec.get("KEY_FUNCTION"), f"{where}['L2']['KEY_FUNCTION']")
        inline = {k: v for k, v in spec.items() if k not in ("BACKEND", "LOCATION")}
        _check_django_settings(
            {name: django_source(inline, spec.get("OPTIONS") or {}, name)
             for name in DJANGO_SETTINGS}, f"{where}['L2']")

    if isinstance(spec, str):
        l2_conf = caches[spec]
        for name in KEY_PARAMS:  # TIMEOUT: below, with Django's precedence
            if name in params:
                theirs = l2_conf.get(name, _PARAM_DEFAULTS[name])
                if not _same(name, params[name], theirs):
                    raise TieredConfigError(
                        f"{alias_path}[{name!r}] = {params[name]!r} differs from "
                        f"CACHES[{spec!r}][{name!r}] = {theirs!r}; a TieredCache over an L2 "
                        f"alias uses that alias's {name}: remove it here or set it there.",
                        E_CONFLICT)
        if our_timeout is not None:
            where_ours, value = our_timeout
            where_theirs, theirs = django_source(
                l2_conf, l2_conf.get("OPTIONS") or {}, "TIMEOUT") or ("['TIMEOUT']", 300)
            if not _same("TIMEOUT", value, theirs):
                raise TieredConfigError(
                    f"{alias_path}{where_ours} = {value!r} differs from "
                    f"CACHES[{spec!r}]{where_theirs} = {theirs!r}; a TieredCache over an L2 "
                    "alias uses that alias's TIMEOUT: remove it here or set it there.",
                    E_CONFLICT)
        for name in PASS_THROUGH_OPTIONS:
            found = ours[name]
            if found is not None:
                raise TieredConfigError(
                    f"{alias_path}{found[0]} = {found[1]!r} is invalid with an L2 "
                    f"alias; set CACHES[{spec!r}]['OPTIONS'][{name!r}] instead (the L2 owns "
                    "the store).", E_CONFLICT)
        backend = l2_conf.get("BACKEND", "")
        l2_location = l2_conf.get("LOCATION", "")
        l2_params = {k: v for k, v in l2_conf.items() if k not in ("BACKEND", "LOCATION")}
        alias: str | None = spec
    else:
        backend = spec["BACKEND"]
        l2_location = spec.get("LOCATION", "")
        l2_params = {k: v for k, v in spec.items() if k not in ("BACKEND", "LOCATION")}
        l2_options = dict(spec.get("OPTIONS") or {})
        for name in KEY_PARAMS:
            if name not in params:
                continue
            value = params[name]
            if name in l2_params and not _same(name, l2_params[name], value):
                raise TieredConfigError(
                    f"{where}['L2'][{name!r}] = {l2_params[name]!r} conflicts with {value!r} "
                    f"set on the tiered alias; set {name} in one place only.", E_CONFLICT)
            l2_params[name] = value
        for name in DJANGO_SETTINGS:
            mine = ours[name]
            if mine is None:
                continue
            value = mine[1]
            theirs_found = django_source(l2_params, l2_options, name)
            if theirs_found is not None:
                if not _same(name, theirs_found[1], value):
                    raise TieredConfigError(
                        f"{where}['L2']{theirs_found[0]} = {theirs_found[1]!r} conflicts with "
                        f"{value!r} "
                        f"set on the tiered alias; set {name} in one place only.", E_CONFLICT)
                continue
            # Passed on under the key it was read from, so the L2 reads it as Django would.
            if LEGACY_KEYS[name] in params:
                l2_params[LEGACY_KEYS[name]] = value
            elif name == "TIMEOUT":
                l2_params[name] = value
            else:
                l2_options[name] = value
        if l2_options:
            l2_params["OPTIONS"] = l2_options
        alias = None

    return TieredConfig(
        where=where,
        l2_alias=alias,
        l2_backend=backend,
        l2_location=l2_location,
        l2_params=l2_params,
        l1_max_entries=opts["L1_MAX_ENTRIES"],
        l1_max_bytes=opts["L1_MAX_BYTES"],
        l1_timeout=opts["L1_TIMEOUT"],
        coherence=opts["COHERENCE"],
        strict_lease=opts["STRICT_LEASE"],
        shared_value_bytes=opts["SHARED_VALUE_BYTES"],
        generation_path=opts["GENERATION_PATH"],
        generation_slots=opts["GENERATION_SLOTS"],
        stampede_lease=opts["STAMPEDE_LEASE"],
        early_refresh=opts["EARLY_REFRESH"],
        breaker_threshold=opts["BREAKER_THRESHOLD"],
        breaker_cooldown=opts["BREAKER_COOLDOWN"],
        serve_stale=opts["SERVE_STALE"],
        coherence_url=coherence_url(where, opts["COHERENCE"], opts["COHERENCE_URL"],
                                     backend, l2_location),
    )
