"""OPTIONS parsing and validation: the one place that turns settings into values.

Why a module of its own: Django's own backends silently fall back to defaults
when a number is malformed (``MAX_ENTRIES="abc"`` becomes 300), and
django-redis ignores some ``OPTIONS`` keys it reads elsewhere. A cache that
quietly runs with other settings than the ones written is a production
incident waiting to happen, so every backend of this package declares its
options as a table of :class:`Option` and parses them here: unknown keys,
wrong types and out-of-range values raise ``ImproperlyConfigured`` naming the
exact setting path, what was given, and what is allowed.

The three settings ``BaseCache`` itself reads (``TIMEOUT``, ``MAX_ENTRIES``,
``CULL_FREQUENCY``) are Django's, not ours: a ``CACHES`` entry that works with
Django's backends must work with ours and mean the same, so they take every
value Django takes (``"1"`` included, and the legacy lower-case keys, with
Django's precedence). Only what Django would silently replace by a default is
refused (see :func:`django_param`).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_MISSING: Any = object()


@dataclass(frozen=True)
class Option:
    """One accepted ``OPTIONS`` key.

    ``parse`` receives the raw value and returns the parsed one, or raises
    ``ValueError`` / ``TypeError`` whose message is ignored: the error shown to
    the user is built from ``allowed``, so every rejection reads the same way.
    """

    name: str
    default: Any
    allowed: str
    parse: Callable[[Any], Any]
    doc: str = ""


@dataclass
class OptionTable:
    """The options of one backend, in declaration order."""

    options: list[Option] = field(default_factory=list)

    def add(self, option: Option) -> Option:
        self.options.append(option)
        return option

    def names(self) -> list[str]:
        return [o.name for o in self.options]

    def __getitem__(self, name: str) -> Option:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)

    def parse(self, given: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
        """Validate ``given`` (the ``OPTIONS`` dict) and return every option's value.

        ``where`` is the setting path used in messages, e.g.
        ``CACHES['default']['OPTIONS']``.
        """
        given = {} if given is None else given
        if not isinstance(given, Mapping):
            raise ImproperlyConfigured(
                f"{where} must be a dict, got {type(given).__name__} {given!r}"
            )
        known = {o.name: o for o in self.options}
        for key in given:
            if key not in known:
                close = difflib.get_close_matches(str(key).upper(), known, n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ImproperlyConfigured(
                    f"{where}[{key!r}] is not a known option{hint} "
                    f"Valid options: {', '.join(sorted(known))}."
                )
        values: dict[str, Any] = {}
        for opt in self.options:
            raw = given.get(opt.name, _MISSING)
            if raw is _MISSING:
                values[opt.name] = opt.default
                continue
            values[opt.name] = parse_value(opt, raw, f"{where}[{opt.name!r}]")
        return values


def parse_value(option: Option, raw: Any, path: str) -> Any:
    """``option.parse(raw)``, or ``ImproperlyConfigured`` naming ``path``, ``raw``, what is allowed.

    One message shape for every rejection, whichever key (OPTIONS or top level) held it.
    """
    try:
        return option.parse(raw)
    except (TypeError, ValueError, OverflowError) as exc:  # 10**400 is past any float
        raise ImproperlyConfigured(
            f"{path} = {raw!r} is invalid; allowed: {option.allowed}."
        ) from exc


# --- parsers -------------------------------------------------------------
# Each returns the parsed value or raises ValueError/TypeError. For our own
# options strings are not coerced to numbers: "8" in a settings file is almost
# always a mistake that hides another one. Django's own settings are the
# exception (django_integer, django_timeout): there "1" is what Django's own
# test suite writes, and refusing it would reject working configurations.


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("not an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError("out of range")
        return value

    return parse


def number(
    lo: float = 0.0, hi: float | None = None, lo_open: bool = False
) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError("not a number")
        value = float(value)
        # Infinity too: every option here has None for "never" or "off", and an
        # infinite lease would reach int() in get_or_set.
        if not math.isfinite(value) or (value <= lo if lo_open else value < lo):
            raise ValueError("out of range")
        if hi is not None and value > hi:
            raise ValueError("out of range")
        return value

    return parse


def optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        return None if value is None else inner(value)

    return parse


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("not a bool")
    return value


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError("not a non-empty string")
    return value


def file_path(value: Any) -> str:
    """A path, made absolute (and ``~`` expanded) once, at start-up: a relative
    one would otherwise name another file in each thread that opens it after an
    ``os.chdir``, as Django's FileBasedCache
    also resolves its directory when built."""
    if isinstance(value, os.PathLike):  # BASE_DIR / "cache", as Django's FileBasedCache takes
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise TypeError("not a non-empty string")
    if "\0" in value:
        raise ValueError("a path with a NUL character")
    # Joined, not normalised (os.path.abspath would be): "link/.." is not the
    # directory "link" is in when "link" is a symbolic link, and the location
    # checks must see the path as the file system will resolve it.
    path = os.path.expanduser(value)
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def choice(*values: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in values:
            raise ValueError("not one of the choices")
        return value

    return parse


def secret(value: Any) -> bytes:
    """A key given as ``str`` or ``bytes`` of at least 16 bytes."""
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes) or len(value) < 16:
        raise ValueError("too short")
    return value


def _key_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise ImproperlyConfigured(
                f"{name} cannot be encoded as UTF-8 (a lone surrogate); allowed: a str or "
                f"bytes key, as Django's signing takes it.") from None
    if isinstance(value, bytes):
        return value
    raise ImproperlyConfigured(f"{name} has type {type(value).__name__}; allowed: a str or "
                               f"bytes key, as Django's signing takes it.")


def signing_secrets() -> tuple[bytes, list[bytes]]:
    """``SECRET_KEY`` and the non-empty, distinct ``SECRET_KEY_FALLBACKS`` as the
    bytes Django's signing uses (``b""`` for an empty or unreadable ``SECRET_KEY``).

    Checked, not just iterated: ``SECRET_KEY_FALLBACKS = "old-key"`` (a str
    where Django wants a list) would make each character a fallback, and a
    value sealed under a one-byte key such as ``b"o"`` would be accepted; an
    entry that is not a key would raise a bare ``TypeError`` while the cache is
    built. The values are never put in a
    message.
    """
    from django.conf import settings

    try:
        current = getattr(settings, "SECRET_KEY", "")
    except ImproperlyConfigured:  # Django refuses to give out an empty SECRET_KEY
        current = ""
    secret = _key_bytes(current, "SECRET_KEY") if current else b""
    fallbacks = getattr(settings, "SECRET_KEY_FALLBACKS", None) or ()
    if not isinstance(fallbacks, (list, tuple)):
        raise ImproperlyConfigured(
            f"SECRET_KEY_FALLBACKS has type {type(fallbacks).__name__}; allowed: a list or "
            f"tuple of str or bytes keys (a single key too goes in a list).")
    older: list[bytes] = []
    for i, fallback in enumerate(fallbacks):
        if fallback:
            key = _key_bytes(fallback, f"SECRET_KEY_FALLBACKS[{i}]")
            if key not in (secret, *older):
                older.append(key)
    return secret, older


# --- the settings Django's BaseCache reads ---------------------------------


def django_integer(value: Any) -> int:
    """An integer as ``BaseCache.__init__`` reads one: whatever ``int()`` accepts.

    ``"30"`` is 30, ``30.9`` is 30 and ``True`` is 1, as in Django. What
    ``int()`` refuses (``"abc"``, ``"2.5"``, ``None``, ``[1]``) Django replaces
    by its default without a word; here it is an error. So is infinity, on
    which Django itself fails with ``OverflowError``.
    """
    try:
        return int(value)
    except OverflowError as exc:
        raise ValueError("not finite") from exc


def django_timeout(value: Any) -> int | float | None:
    """A ``TIMEOUT`` as Django reads it, except that a float keeps its fraction.

    ``None``: never expire; ``0`` or less: expire at once (nothing is kept),
    as in Django. Django truncates the float ``2.5`` to 2, and ``0.5`` to 0,
    which caches nothing at all; a float is used as given here. Strings go
    through ``int()`` as in Django (``"60"`` is 60; ``"2.5"``, which Django
    would replace by 300, is an error).
    """
    if value is None:
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not finite")
        return value
    return django_integer(value)


TIMEOUT = Option(
    "TIMEOUT", 300,
    "a number of seconds (an int, a float, or a string int() reads, such as '60'; "
    "0 or less: expire at once), or None for no expiry",
    django_timeout, doc="Default expiry of a set(); Django's meaning.",
)


def check_key_function(value: Any, path: str) -> None:
    """Raise ``ImproperlyConfigured`` naming ``path`` for a ``KEY_FUNCTION`` that
    Django's ``get_key_func`` would fail on with a bare ImportError or
    AttributeError (an int, a module, a path to nothing), or that is not callable."""
    if value is None or callable(value):
        return
    from django.utils.module_loading import import_string

    allowed = "a callable (key, key_prefix, version), a dotted path to one, or None"
    try:
        found = import_string(value) if isinstance(value, str) else None
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"{path} = {value!r} cannot be imported ({exc}); allowed: {allowed}.") from exc
    if not callable(found):
        raise ImproperlyConfigured(f"{path} = {value!r} is invalid; allowed: {allowed}.")


#: Django's two culling settings, as every value BaseCache takes: shared by
#: ShardedSQLiteCache's table and TieredCache's checks of what it passes on.
MAX_ENTRIES = Option(
    "MAX_ENTRIES", 300,
    "an integer, or a string int() reads, such as '1000' (0 or less: cull at every new "
    "key); or None for no limit",
    optional(django_integer), "Entries across all shards before culling (Django's default: 300).",
)
CULL_FREQUENCY = Option(
    "CULL_FREQUENCY", 3,
    "an integer, or a string int() reads, such as '3' (0 empties the cache; below 0 only "
    "expired entries are culled)",
    django_integer, "Cull 1/CULL_FREQUENCY of the entries when full.",
)
#: The Option that checks each of Django's settings, by name.
DJANGO_OPTIONS = {o.name: o for o in (TIMEOUT, MAX_ENTRIES, CULL_FREQUENCY)}

# The lower-case keys BaseCache.__init__ reads at the top level of the alias,
# before the documented ones (a leftover of Django's old cache URIs).
LEGACY_KEYS = {"TIMEOUT": "timeout", "MAX_ENTRIES": "max_entries",
               "CULL_FREQUENCY": "cull_frequency"}


def django_source(
    params: Mapping[str, Any], options: Mapping[str, Any], name: str
) -> tuple[str, Any] | None:
    """Where Django reads setting ``name`` of an alias: ``(path suffix, raw value)``.

    ``BaseCache.__init__`` reads the legacy lower-case key first (``timeout``,
    ``max_entries``, ``cull_frequency`` next to ``BACKEND``), then the
    documented one (``TIMEOUT`` beside it; ``MAX_ENTRIES`` and
    ``CULL_FREQUENCY`` in ``OPTIONS``). ``None`` when neither is set.
    """
    legacy = LEGACY_KEYS[name]
    if legacy in params:
        return f"[{legacy!r}]", params[legacy]
    if name == "TIMEOUT":
        return (f"[{name!r}]", params[name]) if name in params else None
    if name in options:
        return f"['OPTIONS'][{name!r}]", options[name]
    return None


def django_param(
    params: Mapping[str, Any], option: Option, alias_path: str, parsed: Any = _MISSING
) -> Any:
    """The value of Django's setting ``option.name`` for an alias, with Django's precedence.

    ``alias_path`` is ``CACHES['alias']``. ``parsed`` is the ``OPTIONS`` value
    already validated by the backend's table (for ``MAX_ENTRIES`` and
    ``CULL_FREQUENCY``); a legacy lower-case key overrides it, as in Django.
    """
    legacy = LEGACY_KEYS[option.name]
    if legacy in params:
        return parse_value(option, params[legacy], f"{alias_path}[{legacy!r}]")
    if parsed is not _MISSING:
        return parsed
    if option.name in params:
        return parse_value(option, params[option.name], f"{alias_path}[{option.name!r}]")
    return option.default


def same_django_value(name: str, a: Any, b: Any) -> bool:
    """Do two raw values of Django's setting ``name`` mean the same (``"300"`` and 300)?"""
    if a == b:
        return True
    parse = django_timeout if name == "TIMEOUT" else optional(django_integer)
    try:
        return bool(parse(a) == parse(b))
    except (TypeError, ValueError):
        return False


def setting_path(backend_path: str, location: str, options: Mapping[str, Any] | None) -> str:
    """Best-effort ``CACHES['alias']['OPTIONS']`` path for error messages.

    Django gives a backend its params but not its alias, so we look the alias
    up in ``settings.CACHES`` by BACKEND, LOCATION and OPTIONS, among the
    aliases and the L2s written inline in a TieredCache's ``OPTIONS["L2"]``
    (then the path is ``CACHES['alias']['OPTIONS']['L2']['OPTIONS']``); when
    that is ambiguous (or settings are not configured) the alias is left generic.
    """
    matches: list[str] = []
    try:
        from django.conf import settings

        for name, entry in getattr(settings, "CACHES", {}).items():
            places = [(f"CACHES[{name!r}]", entry)]
            inline = (entry.get("OPTIONS") or {}).get("L2")
            if isinstance(inline, Mapping):
                places.append((f"CACHES[{name!r}]['OPTIONS']['L2']", inline))
            matches += [
                path for path, conf in places
                if conf.get("BACKEND") == backend_path
                and conf.get("LOCATION", "") == location
                and (conf.get("OPTIONS") or {}) == (options or {})
            ]
    except Exception:  # settings not configured: keep the generic path
        pass
    return f"{matches[0]}['OPTIONS']" if len(matches) == 1 else "CACHES[<alias>]['OPTIONS']"
