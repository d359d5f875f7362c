"""Scenarios (the workload as data) and the deterministic per-worker op lists.

A scenario is a TOML file in ``bench/scenarios/``, not a code branch, so a new
workload is a new file and every published result names the exact mix it ran.

Determinism: worker ``i`` draws everything from ``random.Random(seed + i)``
(keys, actions, value sizes and bytes), so a run is reproducible from
``(scenario, seed, procs)`` and two workers never share a stream. The whole
op list is generated before the start barrier, so RNG cost is never timed.
"""

from __future__ import annotations

import random
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from djcachebench.bench.paths import DataNotFound, scenarios_dir

#: The actions a scenario may mix, in report order. The index is the op code.
ACTIONS: tuple[str, ...] = ("get", "set", "delete")
GET, SET, DELETE = 0, 1, 2

#: One operation: (action code, key, value for a set else None).
Op = tuple[int, bytes, bytes | None]


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message names the field."""


@dataclass(frozen=True)
class Scenario:
    """One workload. ``ops`` and ``warmup`` are per process."""

    name: str
    description: str = ""
    procs: int = 8
    ops: int = 100_000
    warmup: int = 1_000
    keys: int = 1_100
    value_min: int = 1
    value_max: int = 495
    prefill: bool = True
    key_prefix: str = ""
    mix: dict[str, float] = field(default_factory=lambda: {"get": 90, "set": 9, "delete": 1})

    def __post_init__(self) -> None:
        for name in ("procs", "keys", "value_min"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ops", "warmup"):
            if getattr(self, name) < 0:
                raise ScenarioError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.value_max < self.value_min:
            raise ScenarioError(f"value_max {self.value_max} < value_min {self.value_min}")
        unknown = set(self.mix) - set(ACTIONS)
        if unknown:
            raise ScenarioError(f"mix: unknown action(s) {sorted(unknown)}; known: {ACTIONS}")
        if any(w < 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ScenarioError(f"mix weights must be >= 0 with a positive sum, got {self.mix}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ScenarioError(
                f"unknown scenario field(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        if "name" not in data:
            raise ScenarioError("a scenario needs a name")
        values = dict(data)
        if "mix" in values:
            values["mix"] = {str(k): float(v) for k, v in dict(values["mix"]).items()}
        try:
            return cls(**values)
        except TypeError as exc:
            raise ScenarioError(str(exc)) from exc

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, **changes: Any) -> Scenario:
        """A copy with the non-None ``changes`` applied (CLI options win over the file)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def fractions(self) -> dict[str, float]:
        """The mix normalised to fractions summing to 1, in ACTIONS order."""
        total = sum(self.mix.values())
        return {a: self.mix.get(a, 0.0) / total for a in ACTIONS}

    def key(self, index: int) -> bytes:
        return f"{self.key_prefix}{index}".encode()


#: The reference workload, the same as bench/scenarios/reference.toml (a test checks).
REFERENCE = Scenario(
    name="reference",
    description="The reference workload: 90/9/1 get/set/delete over 1,100 keys",
)


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a scenario by name (``bench/scenarios/NAME.toml``) or by file path."""
    path = Path(name_or_path)
    if path.suffix != ".toml" and not path.exists():
        try:
            directory = scenarios_dir()
        except DataNotFound:
            # Installed without a checkout (the management command in a user's
            # project): the reference workload is also the dataclass defaults.
            if str(name_or_path) == REFERENCE.name:
                return REFERENCE
            raise
        path = directory / f"{name_or_path}.toml"
        if not path.is_file():
            names = ", ".join(sorted(p.stem for p in directory.glob("*.toml")))
            raise ScenarioError(f"no scenario {str(name_or_path)!r}; available: {names}")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    return Scenario.from_dict(data)


def generate_ops(scenario: Scenario, seed: int, worker: int, count: int | None = None) -> list[Op]:
    """The op list of one worker: ``warmup + ops`` operations unless ``count`` is given.

    Deterministic for ``(scenario, seed, worker)``; draws, per op: the action
    (one uniform float against the cumulative mix), the key, and for a set the
    value's size and bytes.
    """
    rng = random.Random(seed + worker)
    n = scenario.warmup + scenario.ops if count is None else count
    fractions = scenario.fractions()
    get_below = fractions["get"]
    set_below = get_below + fractions["set"]
    keys = [scenario.key(i) for i in range(scenario.keys)]
    vmin, vmax = scenario.value_min, scenario.value_max
    ops: list[Op] = []
    append = ops.append
    for _ in range(n):
        choice = rng.random()
        key = keys[rng.randrange(scenario.keys)]
        if choice < get_below:
            append((GET, key, None))
        elif choice < set_below:
            append((SET, key, rng.randbytes(rng.randint(vmin, vmax))))
        else:
            append((DELETE, key, None))
    return ops


def prefill_items(scenario: Scenario, seed: int) -> Iterator[tuple[bytes, bytes]]:
    """Every key once, with a value from its own stream (independent of the workers')."""
    rng = random.Random(f"prefill-{seed}")
    for index in range(scenario.keys):
        yield (
            scenario.key(index),
            rng.randbytes(rng.randint(scenario.value_min, scenario.value_max)),
        )
