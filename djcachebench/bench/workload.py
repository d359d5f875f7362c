"""Scenarios (the workload as data) and the deterministic per-worker op lists.

A scenario is a TOML file in ``bench/scenarios/`` (shipped in the package as
data, see :mod:`~djcachebench.bench.paths`), not a code branch, so a new
workload is a new file and every
published result names the exact workload it ran: the mix of actions, the
keys (how many, ``str`` or ``bytes``, how popular: :mod:`~djcachebench.bench.keys`)
and the values (what kind, how big: :mod:`~djcachebench.bench.values`).

Determinism: worker ``i`` draws everything from ``random.Random(seed + i)``
(per op: the action, the key, and for a set the value), so a run is
reproducible from ``(scenario, seed, procs)`` and two workers never share a
stream. The whole op list, the Zipf table and the value pool are built before
the start barrier, so none of that is ever timed. The reference scenario's op
lists are the same, call for call, as before values and keys became
configurable (a test pins them).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from random import Random
from typing import Any

from djcachebench.bench import keys as keys_mod
from djcachebench.bench import values as values_mod
from djcachebench.bench.paths import DataNotFound, scenarios_dir
from djcachebench.bench.results import usable_cpus
from djcachebench.bench.targets import KEY_LIMIT

#: The actions a scenario may mix, in report order. The index is the op code.
ACTIONS: tuple[str, ...] = ("get", "set", "delete", "incr")
GET, SET, DELETE, INCR = 0, 1, 2, 3

#: One operation: (action code, key, value for a set else None).
Op = tuple[int, str | bytes, Any]


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message names the field."""


@dataclass(frozen=True)
class Scenario:
    """One workload. ``ops`` and ``warmup`` are per process.

    Defaults are those of a new scenario (``str`` keys, values from a pool);
    the reference scenario sets ``key_type = "bytes"`` and ``value_pool = 0``
    to stay what it always was.
    """

    name: str
    description: str = ""
    procs: int = 8
    ops: int = 100_000
    warmup: int = 1_000
    keys: int = 1_100
    key_type: str = "str"
    key_popularity: str = "uniform"
    zipf_s: float = 1.0
    key_prefix: str = ""
    value_kind: str = "bytes"
    value_dist: str = "uniform"
    value_min: int = 1
    value_max: int = 495
    #: Distinct values per process; None: as many as the memory budget allows;
    #: 0: a fresh value for every set (the reference's way).
    value_pool: int | None = None
    prefill: bool = True
    mix: dict[str, float] = field(default_factory=lambda: {"get": 90, "set": 9, "delete": 1})
    #: The entry limit (``MAX_ENTRIES``) of every target that has one: an int,
    #: or ``"keys"`` for room for all the scenario's keys (see entry_limit()).
    #: Why scenario data: whether a bounded cache may cull is part of the
    #: workload; the reference keeps its caches at 1,000 keys, while many-keys
    #: compares with diskcache, redis and memcached, which hold every key.
    max_entries: int | str = KEY_LIMIT["MAX_ENTRIES"]
    #: Threads per worker process, each calling the cache's sync methods with
    #: its own op list (a gunicorn ``gthread`` worker's threads).
    threads: int = 1
    #: asyncio tasks per worker process calling ``aget``/``aset``/... on one
    #: event loop (an ASGI server's concurrent requests); 0: sync calls.
    tasks: int = 0

    def __post_init__(self) -> None:
        self._check_types()
        # ops as the CLI's --ops: a run of no measured op would "run" and report
        # ok with no figure at all.
        for name in ("procs", "ops", "keys", "value_min"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup",):
            if getattr(self, name) < 0:
                raise ScenarioError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.value_max < self.value_min:
            raise ScenarioError(f"value_max {self.value_max} < value_min {self.value_min}")
        if self.value_max > values_mod.MAX_VALUE_SIZE:
            raise ScenarioError(
                f"value_max must be <= {values_mod.MAX_VALUE_SIZE:,} bytes (512 MiB), "
                f"got {self.value_max:,}"
            )
        if self.procs > max_procs():
            raise ScenarioError(
                f"procs must be <= {max_procs():,} ({PROCS_PER_CORE} per usable core), "
                f"got {self.procs:,}"
            )
        if self.keys > MAX_KEYS:
            raise ScenarioError(f"keys must be <= {MAX_KEYS:,}, got {self.keys:,}")
        if self.warmup + self.ops > MAX_OPS:
            raise ScenarioError(f"warmup + ops must be <= {MAX_OPS:,} per process, got "
                                f"{self.warmup + self.ops:,}")
        self._check_lanes()
        self._check_choice("key_type", keys_mod.KEY_TYPES)
        self._check_choice("key_popularity", keys_mod.POPULARITIES)
        self._check_choice("value_kind", values_mod.KINDS)
        self._check_choice("value_dist", values_mod.SIZE_DISTS)
        if not self.zipf_s > 0:
            raise ScenarioError(f"zipf_s must be > 0, got {self.zipf_s}")
        if self.value_dist == "fixed" and self.value_min != self.value_max:
            raise ScenarioError(
                f"value_dist 'fixed' needs value_min == value_max, got "
                f"{self.value_min} and {self.value_max}"
            )
        if self.value_pool is not None and self.value_pool < 0:
            raise ScenarioError(f"value_pool must be >= 0, got {self.value_pool}")
        unknown = set(self.mix) - set(ACTIONS)
        if unknown:
            raise ScenarioError(f"mix: unknown action(s) {sorted(unknown)}; known: {ACTIONS}")
        total = sum(self.mix.values())
        if any(w < 0 for w in self.mix.values()) or not 0 < total < math.inf:
            # An infinite sum (weights near 1e308) would turn every fraction into nan.
            raise ScenarioError(
                f"mix weights must be >= 0 with a positive, finite sum, got {self.mix}"
            )
        if self.max_entries != "keys" and (
            isinstance(self.max_entries, bool)
            or not isinstance(self.max_entries, int)
            or self.max_entries < 1
        ):
            raise ScenarioError(
                f"max_entries must be an int >= 1 or 'keys', got {self.max_entries!r}"
            )
        if self.mix.get("incr", 0) > 0 and self.value_kind != "int":
            raise ScenarioError(
                f"mix: incr needs value_kind = 'int' (counters), got {self.value_kind!r}"
            )

    def _check_types(self) -> None:
        """Every field of the type it must have, before any comparison uses it.

        TOML gives ``procs = "8"`` a str and ``procs = 1.5`` a float; neither
        may reach a worker (where it raised a traceback) or a comparison (where
        it raised "'<' not supported"). bool is no int here (``procs = true``),
        and a number must be finite (``nan`` passes every ``<`` test).
        """
        for f in fields(self):
            value = getattr(self, f.name)
            allowed = FIELD_TYPES[f.name]
            if f.name == "max_entries" and value == "keys":
                continue
            if f.name == "value_pool" and value is None:
                continue
            if allowed == "number":
                ok = _is_int(value) or (isinstance(value, float) and math.isfinite(value))
            elif allowed is int:
                ok = _is_int(value)
            else:
                ok = type(value) is allowed
            if not ok:
                raise ScenarioError(
                    f"{f.name} must be {FIELD_HELP[f.name]}, got {value!r} ({type(value).__name__})"
                )
        for action, weight in self.mix.items():
            if not isinstance(action, str) or not (
                _is_int(weight) or (isinstance(weight, float) and math.isfinite(weight))
            ):
                raise ScenarioError(
                    f"mix: {action!r} must have a finite number as its weight, got {weight!r}"
                )

    def _check_lanes(self) -> None:
        """Threads or tasks, not both, and at least one measured op for each."""
        if self.threads < 1 or self.threads > MAX_LANES:
            raise ScenarioError(f"threads must be 1..{MAX_LANES:,}, got {self.threads:,}")
        if self.tasks < 0 or self.tasks > MAX_LANES:
            raise ScenarioError(f"tasks must be 0..{MAX_LANES:,}, got {self.tasks:,}")
        if self.threads > 1 and self.tasks:
            # Both would be threads each running its own loop: not what a
            # gthread or an ASGI worker runs, and not what a sweep compares.
            raise ScenarioError(
                f"threads ({self.threads}) and tasks ({self.tasks}) cannot be combined: "
                f"a worker runs sync threads or async tasks"
            )
        if self.ops < self.lanes:
            raise ScenarioError(
                f"ops ({self.ops:,} per process) must be at least the {self.lanes:,} "
                f"{'tasks' if self.tasks else 'threads'} it is shared among"
            )

    @property
    def lanes(self) -> int:
        """Callers per worker process: its threads, or its asyncio tasks."""
        return self.tasks or self.threads

    @property
    def streams(self) -> int:
        """Callers of the whole run; stream ``s`` is lane ``s % lanes`` of process
        ``s // lanes``, and draws its ops from ``Random(seed + s)``."""
        return self.procs * self.lanes

    def stream_counts(self, stream: int) -> tuple[int, int]:
        """``(warm-up ops, measured ops)`` of one stream.

        ``ops`` and ``warmup`` stay per process: a process's lanes share them
        (the first lanes take one more when they do not divide evenly), so a
        sweep over threads or tasks runs the same total at every point.
        """
        lane = stream % self.lanes
        return _share(self.warmup, self.lanes, lane), _share(self.ops, self.lanes, lane)

    def _check_choice(self, name: str, allowed: tuple[str, ...]) -> None:
        if getattr(self, name) not in allowed:
            raise ScenarioError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ScenarioError(
                f"unknown scenario field(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        if "name" not in data:
            raise ScenarioError("a scenario needs a name")
        values = dict(data)
        if "mix" in values:
            if not isinstance(values["mix"], Mapping):
                raise ScenarioError(
                    f"mix must be a table of action = weight (e.g. [mix] get = 90), "
                    f"got {values['mix']!r}"
                )
            mix = dict(values["mix"])
            for action, weight in mix.items():
                if not (_is_int(weight) or isinstance(weight, float)):
                    raise ScenarioError(
                        f"mix: {action!r} must have a number as its weight, got {weight!r}"
                    )
            values["mix"] = {str(k): float(v) for k, v in mix.items()}
        if _is_int(values.get("zipf_s")):
            values["zipf_s"] = float(values["zipf_s"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ScenarioError(str(exc)) from exc

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, **changes: Any) -> Scenario:
        """A copy with the non-None ``changes`` applied (CLI options win over the file)."""
        try:
            return replace(self, **{k: v for k, v in changes.items() if v is not None})
        except TypeError as exc:
            raise ScenarioError(str(exc)) from exc

    def with_value_size(self, lo: int, hi: int) -> Scenario:
        """Sizes ``lo..hi``: a fixed size when equal, else the scenario's spread (or uniform)."""
        if lo == hi:
            return replace(self, value_min=lo, value_max=hi, value_dist="fixed")
        dist = "uniform" if self.value_dist == "fixed" else self.value_dist
        return replace(self, value_min=lo, value_max=hi, value_dist=dist)

    def entry_limit(self) -> int:
        """The ``MAX_ENTRIES`` targets with a key-count limit run with.

        ``"keys"`` gives twice the key count: Django's culling starts when the
        count *reaches* the limit (LocMemCache culls on a set into a full
        cache even when the key is already there), so a limit of exactly the
        key count would still cull; twice it never does, and it follows a
        ``--keys`` override.
        """
        if self.max_entries == "keys":
            return 2 * self.keys
        return int(self.max_entries)

    def fractions(self) -> dict[str, float]:
        """The mix's actions normalised to fractions summing to 1, in ACTIONS order."""
        total = sum(self.mix.values())
        return {a: self.mix[a] / total for a in ACTIONS if a in self.mix}

    def key(self, index: int) -> str | bytes:
        return keys_mod.key_maker(self.key_prefix, self.key_type)(index)


#: The most keys a scenario may have: the Zipf table and the pre-fill order hold
#: one entry per key (8 bytes each and more), so 10^13 keys was an hour of
#: table building and then an out-of-memory kill, not a benchmark.
MAX_KEYS = 100_000_000
#: The most ops (warm-up included) of one process: each worker holds its whole
#: op list (about 100 bytes an op), and the parent makes each again to check
#: the answers, so ``--ops 50000000`` asks for tens of GiB and the workers die
#: mid-run.
MAX_OPS = 20_000_000
#: Worker processes per usable core a run may start, at most. Why a bound:
#: past a few per core a run measures the scheduler, and at some thousands the
#: forks exhaust the machine's memory before anything is measured.
PROCS_PER_CORE = 64
#: Threads or tasks per worker process, at most: each thread holds a stack,
#: and a task that hops to a thread (``sync_to_async``) holds one too.
MAX_LANES = 4096


#: Above these, a run's data volume is announced: a cache held in memory needs
#: the stored bytes in RAM (locmem once per worker process), a disk cache on disk.
STORED_WARNING_BYTES = 1 << 30
WRITTEN_WARNING_BYTES = 10 << 30


def volume_warning(scenario: Scenario) -> str | None:
    """The warning printed, before the first target starts, when a run stores or
    writes more than a laptop holds.

    ``--value-size 100k-10M`` over the reference's keys stores ~5 GiB in every
    target and would run, silently, for hours.
    """
    mean = values_mod.mean_value_size(
        scenario.value_kind, scenario.value_dist, scenario.value_min, scenario.value_max
    )
    sets = scenario.procs * (scenario.warmup + scenario.ops) * scenario.fractions().get("set", 0)
    stored = scenario.keys * mean
    written = ((scenario.keys if scenario.prefill else 0) + sets) * mean
    if stored < STORED_WARNING_BYTES and written < WRITTEN_WARNING_BYTES:
        return None
    gib = 1 << 30
    return (
        f"this run stores up to {stored / gib:,.1f} GiB in each target ({scenario.keys:,} keys "
        f"x {mean:,.0f} B mean value) and writes about {written / gib:,.1f} GiB per target: a "
        f"cache in memory needs that much RAM (locmem once per worker process), a disk cache "
        f"that much free disk. Lower --keys, --ops or --value-size to shrink it."
    )


def max_procs() -> int:
    """The most worker processes (or gunicorn workers) a run may start here."""
    return PROCS_PER_CORE * usable_cpus()


#: The type each scenario field must have: int (not bool), "number" (a finite
#: int or float), or exactly this type; FIELD_HELP says it in the error.
FIELD_TYPES: dict[str, Any] = {
    "name": str, "description": str, "procs": int, "ops": int, "warmup": int, "keys": int,
    "key_type": str, "key_popularity": str, "zipf_s": "number", "key_prefix": str,
    "value_kind": str, "value_dist": str, "value_min": int, "value_max": int,
    "value_pool": int, "prefill": bool, "mix": dict, "max_entries": int, "threads": int,
    "tasks": int,
}  # fmt: skip
FIELD_HELP: dict[str, str] = {
    **{k: "an integer" for k, v in FIELD_TYPES.items() if v is int},
    **{k: "a string" for k, v in FIELD_TYPES.items() if v is str},
    "zipf_s": "a finite number > 0",
    "value_pool": "an integer >= 0 (or absent: as many values as the memory budget allows)",
    "prefill": "true or false",
    "mix": "a table of action = weight (e.g. [mix] get = 90)",
    "max_entries": "an integer >= 1 or 'keys'",
}


def _share(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` split into ``parts`` (the first ones take the remainder)."""
    return total // parts + (1 if index < total % parts else 0)


def _is_int(value: Any) -> bool:
    """An int that is not a bool (TOML's ``true`` is no process count)."""
    return isinstance(value, int) and not isinstance(value, bool)


#: The reference workload, the same as scenarios/reference.toml (a test checks).
REFERENCE = Scenario(
    name="reference",
    description="The reference workload: 90/9/1 get/set/delete over 1,100 keys",
    key_type="bytes",
    value_pool=0,
)


def scenario_names() -> list[str]:
    """The shipped scenarios' names."""
    return sorted(p.stem for p in scenarios_dir().glob("*.toml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a scenario by name (a shipped ``scenarios/NAME.toml``) or by file path."""
    path = Path(name_or_path)
    if path.suffix != ".toml" and not path.exists():
        try:
            directory = scenarios_dir()
        except DataNotFound:
            # Installed without a checkout (the management command in a user's
            # project): the reference workload is also REFERENCE.
            if str(name_or_path) == REFERENCE.name:
                return REFERENCE
            raise
        path = directory / f"{name_or_path}.toml"
        if not path.is_file():
            names = ", ".join(scenario_names())
            raise ScenarioError(f"no scenario {str(name_or_path)!r}; available: {names}")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    try:
        return Scenario.from_dict(data)
    except ScenarioError as exc:
        raise ScenarioError(f"scenario {path}: {exc}") from None


def _value_source(scenario: Scenario, seed: int) -> Any:
    return values_mod.value_source(
        scenario.value_kind,
        scenario.value_dist,
        scenario.value_min,
        scenario.value_max,
        scenario.value_pool,
        seed,
    )


def generate_ops(scenario: Scenario, seed: int, worker: int, count: int | None = None) -> list[Op]:
    """The op list of one stream (a worker process's thread or task; the process
    itself without them): its share of ``warmup + ops`` unless ``count`` is given.

    Deterministic for ``(scenario, seed, worker)``; draws, per op: the action
    (one uniform float against the cumulative mix), the key index, and for a
    set the value. Keys are made once per distinct index (a dict), so a
    million-key scenario holds only the keys its ops use.
    """
    rng = Random(seed + worker)
    n = sum(scenario.stream_counts(worker)) if count is None else count
    # Cumulative thresholds over the actions that occur; the last one takes the rest.
    thresholds: list[tuple[float, int]] = []
    below = 0.0
    for action, fraction in scenario.fractions().items():
        code = ACTIONS.index(action)
        if fraction > 0:
            below += fraction
            thresholds.append((below, code))
    *firsts, (_, last_code) = thresholds
    draw_key = keys_mod.sampler(scenario.keys, scenario.key_popularity, scenario.zipf_s)
    draw_value = _value_source(scenario, seed)
    make_key = keys_mod.key_maker(scenario.key_prefix, scenario.key_type)
    made: dict[int, str | bytes] = {}
    ops: list[Op] = []
    append = ops.append
    for _ in range(n):
        choice = rng.random()
        index = draw_key(rng)
        key = made.get(index)
        if key is None:
            key = made[index] = make_key(index)
        code = last_code
        for limit, candidate in firsts:
            if choice < limit:
                code = candidate
                break
        append((code, key, draw_value(rng) if code == SET else None))
    return ops


def key_batches(scenario: Scenario, size: int = 1_000) -> Iterator[list[str | bytes]]:
    """Every key of the scenario, ``size`` at a time (a million keys never make one list)."""
    for start in range(0, scenario.keys, size):
        yield [scenario.key(i) for i in range(start, min(start + size, scenario.keys))]


def prefill_items(
    scenario: Scenario, seed: int, limit: int | None = None
) -> Iterator[tuple[str | bytes, Any]]:
    """The pre-fill's (key, value) pairs, from a stream independent of the workers'.

    With ``limit`` (the cache's key-count limit), only that many of the most
    popular keys: see :func:`~djcachebench.bench.keys.prefill_order`.
    """
    rng = Random(f"prefill-{seed}")
    draw_value = _value_source(scenario, seed)
    make_key = keys_mod.key_maker(scenario.key_prefix, scenario.key_type)
    for index in keys_mod.prefill_order(scenario.keys, scenario.key_popularity, limit):
        yield make_key(index), draw_value(rng)


def batches(
    items: Iterator[tuple[str | bytes, Any]], max_items: int = 1_000, max_bytes: int = 16 << 20
) -> Iterator[dict[str | bytes, Any]]:
    """Group pre-fill items for ``set_many``: at most ``max_items`` and about ``max_bytes``."""
    batch: dict[str | bytes, Any] = {}
    size = 0
    for key, value in items:
        batch[key] = value
        size += values_mod.value_size(value)
        if len(batch) >= max_items or size >= max_bytes:
            yield batch
            batch, size = {}, 0
    if batch:
        yield batch
