"""OPTIONS parsing and validation: the one place that turns settings into values.

Why a module of its own: Django's own backends silently fall back to defaults
when a number is malformed (``MAX_ENTRIES="abc"`` becomes 300), and
django-redis ignores some ``OPTIONS`` keys it reads elsewhere. A cache that
quietly runs with other settings than the ones written is a production
incident waiting to happen, so every backend of this package declares its
options as a table of :class:`Option` and parses them here: unknown keys,
wrong types and out-of-range values raise ``ImproperlyConfigured`` naming the
exact setting path, what was given, and what is allowed.
"""

from __future__ import annotations

import difflib
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
            try:
                values[opt.name] = opt.parse(raw)
            except (TypeError, ValueError) as exc:
                raise ImproperlyConfigured(
                    f"{where}[{opt.name!r}] = {raw!r} is invalid; allowed: {opt.allowed}."
                ) from exc
        return values


# --- parsers -------------------------------------------------------------
# Each returns the parsed value or raises ValueError/TypeError. Strings are not
# coerced to numbers: "8" in a settings file is almost always a mistake that
# hides another one, and Django's own int() coercion is what we refuse to copy.


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
        if value != value or (value <= lo if lo_open else value < lo):
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


def setting_path(backend_path: str, location: str, options: Mapping[str, Any] | None) -> str:
    """Best-effort ``CACHES['alias']['OPTIONS']`` path for error messages.

    Django gives a backend its params but not its alias, so we look the alias
    up in ``settings.CACHES`` by BACKEND, LOCATION and OPTIONS; when that is
    ambiguous (or settings are not configured) the alias is left generic.
    """
    alias = "<alias>"
    try:
        from django.conf import settings

        matches = [
            name
            for name, conf in getattr(settings, "CACHES", {}).items()
            if conf.get("BACKEND") == backend_path
            and conf.get("LOCATION", "") == location
            and (conf.get("OPTIONS") or {}) == (options or {})
        ]
        if len(matches) == 1:
            alias = matches[0]
    except Exception:  # settings not configured: keep the generic path
        pass
    return f"CACHES[{alias!r}]['OPTIONS']" if alias != "<alias>" else "CACHES[<alias>]['OPTIONS']"
