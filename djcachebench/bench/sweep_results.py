"""A sweep's results: every point's value and that point's :class:`Results`.

Its own module, as ``results.py`` is: the sweep command writes it, and the
chart (``sweep_plot.py``) and report read it, without either importing the
other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from djcachebench.bench.results import (
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    Results,
    ResultsError,
    utc_now,
)

__all__ = ["Sweep"]


@dataclass
class Sweep:
    """Every point of a sweep: the parameter's value and that point's Results."""

    parameter: str
    values: list[int]
    points: list[Results]
    action: str = "get"
    command: list[str] = field(default_factory=list)
    created: str = field(default_factory=utc_now)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "sweep",
            "created": self.created,
            "command": self.command,
            "parameter": self.parameter,
            "values": self.values,
            "action": self.action,
            "points": [
                {"value": v, "results": r.to_dict()}
                for v, r in zip(self.values, self.points, strict=True)
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sweep:
        if data.get("kind") != "sweep" or data.get("schema_version") not in READABLE_VERSIONS:
            raise ResultsError(
                f"not a sweep file of a readable schema (kind {data.get('kind')!r}, "
                f"schema_version {data.get('schema_version')!r})"
            )
        try:
            return cls(
                parameter=data["parameter"],
                values=[int(p["value"]) for p in data["points"]],
                points=[Results.from_dict(p["results"]) for p in data["points"]],
                action=data.get("action", "get"),
                command=list(data.get("command", [])),
                created=data["created"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"malformed sweep: {exc!r}") from exc

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Sweep:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"cannot read sweep {path}: {exc}") from exc
        return cls.from_dict(data)

    def backends(self) -> list[str]:
        """Every backend that ran at some point, in first-seen order."""
        names: dict[str, None] = {}
        for results in self.points:
            names.update(dict.fromkeys(b.name for b in results.backends))
        return list(names)
