"""The fixed-baseline gate: this tree's hot paths against a baseline commit's, as ratios.

Usage: python bench/gate.py [--baseline 65a844b] [--rounds 4] [--ops 200000]
                            [--proc-ops 20000] [--procs 8] [--quick] [--out FILE]
                            [--trees DIR] [--remove-tree]

Why: on a shared machine two runs of the same code one after the other differ by
more than the changes worth measuring, so the gate never compares a figure with one
taken at another moment. It checks out the baseline commit in a git worktree and
runs both trees in turns, A B in odd rounds and B A in even ones (A the baseline,
B this tree), and reports every measure as B's figure over A's within a round: a
drift of the machine slower than a round cancels, and the median and the spread
of the rounds' ratios say how far the rest goes.

The instrument is this file for both trees. The timing loop and the multi-process
runner live here, run in child processes with ``PYTHONPATH=<tree>``, and reach the
caches only through Django's cache API (``caches[alias]``, get/set/delete), so only
the backends' code differs between A and B. Neither tree's ``djcachebench bench``
harness is used: what it switches on around a target changed between commits. The
same ``CACHES`` settings are given to both trees (only options both accept). The
references of the in-run ratios are the same code in both runs: diskcache and
LocMemCache from the installed packages, and the sqlite floor (``BareSQLiteCache``)
loaded from this tree's ``djcachebench/bench/floor.py`` with this tree's lock
waiting (``store/retry.py``) whichever tree is under test; the two SQLite error
helpers it takes from ``store/shard.py`` come from the tree under test (the same
at 65a844b). Percentiles are this tree's ``bench/stats.py`` nearest rank.

Measures, on the reference workload (1,100 bytes keys, values of 1-495 random bytes,
a fresh value per set, 90% get / 9% set / 1% delete; op lists from fixed seeds, so
both trees do the same calls):

* per call, one process: the median ns of ShardedSQLiteCache's get and set and of
  TieredCache's (over a ShardedSQLiteCache alias: its get median is the L1 hit),
  every call timed with ``perf_counter_ns`` after a pre-fill and an untimed warm-up;
* ``--procs`` processes (spawned, released by one barrier, each with its own seeded
  op list, after worker 0's pre-fill and every worker's warm-up): per target the
  span (from the first worker's release to the last worker's end) and the get and
  set p50 of the merged samples. Targets: sqlite, tiered (over a sqlite alias),
  the floor, diskcache (its defaults) and locmem; the caches that have a limit keep
  1,000 keys (``MAX_ENTRIES`` 1000, ``CULL_FREQUENCY`` 10; TieredCache's L2 too).

The text output is for reading; ``--out`` (default a new temporary directory's
``gate.json``, printed at the end) holds every round's figures and the summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: The tree this gate belongs to: its instrument files serve both trees.
HERE = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "65a844b"

KEYS = 1_100
VALUE_SIZES = (1, 495)
MIX = {"get": 90, "set": 9, "delete": 1}
ACTIONS = tuple(MIX)
GET, SET, DELETE = range(3)
KEY_LIMIT = {"MAX_ENTRIES": 1000, "CULL_FREQUENCY": 10}
SEED = 0
# A set lives longer than any run, so no key expires inside a measurement.
SET_TIMEOUT = 3600
FLOOR_MODULE = "gate_reference_floor"
#: The targets of the multi-process run, in the order each child runs them: the
#: references (the same code for both trees) first, so that nothing the tree under test
#: left behind runs under them.
TARGETS = ("floor", "diskcache", "locmem", "sqlite", "tiered")
#: Ratios within one tree's run: (label, numerator, denominator), each (target, figure).
IN_RUN = (
    ("sqlite span / floor span", ("sqlite", "span_s"), ("floor", "span_s")),
    ("sqlite get p50 / diskcache get p50", ("sqlite", "get_p50_ns"), ("diskcache", "get_p50_ns")),
    ("tiered get p50 / locmem get p50", ("tiered", "get_p50_ns"), ("locmem", "get_p50_ns")),
    ("tiered set p50 / sqlite set p50", ("tiered", "set_p50_ns"), ("sqlite", "set_p50_ns")),
    ("tiered span / sqlite span", ("tiered", "span_s"), ("sqlite", "span_s")),
)
#: The multi-process figures compared across trees; the last three are the same code
#: in both runs, so their ratio shows the noise of the moment.
MULTI_ROWS = (
    ("sqlite", "span_s"), ("sqlite", "get_p50_ns"), ("sqlite", "set_p50_ns"),
    ("tiered", "span_s"), ("tiered", "get_p50_ns"), ("tiered", "set_p50_ns"),
    ("floor", "span_s"), ("diskcache", "get_p50_ns"), ("locmem", "get_p50_ns"),
)
SAME_CODE = ("floor", "diskcache", "locmem")
BARRIER_WAIT = 600.0


def from_this_tree(name: str, relpath: str) -> ModuleType:
    """A module of this tree's files under its own name, whatever tree PYTHONPATH names."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / relpath)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stats() -> ModuleType:
    return from_this_tree("gate_reference_stats", "djcachebench/bench/stats.py")


def median(values: Sequence[float]) -> float:
    return stats().percentile(sorted(values), 50)


# --- the workload ---------------------------------------------------------------------


def op_list(seed: str, count: int) -> list[tuple[int, bytes, bytes | None]]:
    """``count`` operations of the reference mix, all drawn from ``Random(seed)``."""
    rng = random.Random(seed)
    weights = list(MIX.values())
    ops: list[tuple[int, bytes, bytes | None]] = []
    for _ in range(count):
        action = rng.choices(range(len(ACTIONS)), weights)[0]
        key = str(rng.randrange(KEYS)).encode()
        value = rng.randbytes(rng.randint(*VALUE_SIZES)) if action == SET else None
        ops.append((action, key, value))
    return ops


def prefill(cache: Any) -> None:
    rng = random.Random(f"prefill-{SEED}")
    for i in range(KEYS):
        cache.set(str(i).encode(), rng.randbytes(rng.randint(*VALUE_SIZES)), SET_TIMEOUT)


def timed(cache: Any, ops: list[tuple[int, bytes, bytes | None]]) -> list[array]:
    """Run ``ops``, each call timed alone; the ns of each, per action."""
    samples = [array("q") for _ in ACTIONS]
    gets, sets, deletes = (s.append for s in samples)
    get, set_, delete = cache.get, cache.set, cache.delete
    now = time.perf_counter_ns
    for action, key, value in ops:
        if action == GET:
            start = now()
            get(key)
            gets(now() - start)
        elif action == SET:
            start = now()
            set_(key, value, SET_TIMEOUT)
            sets(now() - start)
        else:
            start = now()
            delete(key)
            deletes(now() - start)
    return samples


# --- child processes: one tree under test ---------------------------------------------


def caches_settings(workdir: Path) -> dict[str, Any]:
    """The same CACHES for both trees (options 65a844b accepts as well)."""
    def sqlite(name: str) -> dict[str, Any]:
        return {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                "LOCATION": str(workdir / name), "OPTIONS": dict(KEY_LIMIT)}

    return {
        "default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
        "sqlite": sqlite("sqlite"),
        "tiered-l2": sqlite("tiered-l2"),
        "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                   "OPTIONS": {"L2": "tiered-l2"}},
        "floor": {"BACKEND": f"{FLOOR_MODULE}.BareSQLiteCache", "LOCATION": str(workdir / "floor")},
        "diskcache": {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(workdir / "diskcache")},
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                   "LOCATION": "gate", "OPTIONS": dict(KEY_LIMIT)},
    }


def load_reference_floor() -> None:
    """This tree's BareSQLiteCache and lock waiting, whichever tree is under test."""
    import djcachebench.store.shard  # noqa: F401  the tested tree's, before the swap below

    retry = from_this_tree("gate_reference_retry", "djcachebench/store/retry.py")
    name = "djcachebench.store.retry"
    saved = sys.modules.get(name)
    sys.modules[name] = retry  # what the floor's `from ... import spin_sleep` binds
    try:
        from_this_tree(FLOOR_MODULE, "djcachebench/bench/floor.py")
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def configure(spec: dict[str, Any]) -> Any:
    """Django configured for the tree under test; returns ``caches``."""
    import djcachebench

    tree = Path(spec["tree"]).resolve()
    if not Path(djcachebench.__file__).resolve().is_relative_to(tree):
        raise RuntimeError(f"djcachebench imported from {djcachebench.__file__}, not {tree}")
    load_reference_floor()
    import django
    from django.conf import settings

    settings.configure(CACHES=caches_settings(Path(spec["workdir"])), USE_TZ=True,
                       SECRET_KEY="djcachebench-gate-not-secret")
    django.setup()
    from django.core.cache import caches

    return caches


def run_percall(spec: dict[str, Any]) -> dict[str, Any]:
    """One process: each of sqlite and tiered pre-filled, warmed up, then timed per call."""
    caches = configure(spec)
    warmup = op_list(f"warmup-{SEED}", spec["warmup"])
    ops = op_list(f"percall-{SEED}", spec["ops"])
    out: dict[str, Any] = {}
    for alias in ("sqlite", "tiered"):
        cache = caches[alias]
        prefill(cache)
        timed(cache, warmup)
        samples = timed(cache, ops)
        out[alias] = {f"{action}_ns": median(s) if s else None
                      for action, s in zip(ACTIONS, samples, strict=True)}
        out[alias]["counts"] = {a: len(s) for a, s in zip(ACTIONS, samples, strict=True)}
    return out


def multi_worker(spec: dict[str, Any], alias: str, index: int, barrier: Any, queue: Any) -> None:
    """One of ``procs`` workers of one target; puts (index, start, end, samples, error)."""
    try:
        cache = configure(spec)[alias]
        warmup = op_list(f"warmup-{SEED}-{index}", spec["warmup"])
        ops = op_list(f"multi-{SEED}-{index}", spec["proc_ops"])
        if index == 0:
            cache.clear()
            prefill(cache)
        barrier.wait(BARRIER_WAIT)  # the pre-fill is done before anyone's warm-up
        timed(cache, warmup)
        barrier.wait(BARRIER_WAIT)  # the release: the span starts here
        start = time.perf_counter_ns()
        samples = timed(cache, ops)
        end = time.perf_counter_ns()
        queue.put((index, start, end, [s.tobytes() for s in samples], None))
    except BaseException:
        barrier.abort()
        queue.put((index, 0, 0, None, traceback.format_exc()))


def run_multi(spec: dict[str, Any]) -> dict[str, Any]:
    """Every target in turn under ``procs`` spawned workers released by one barrier."""
    stat = stats()
    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {}
    for alias in TARGETS:
        # The previous target's writes are flushed now, not by the kernel inside this
        # target's span.
        os.sync()
        barrier, queue = ctx.Barrier(spec["procs"]), ctx.Queue()
        workers = [ctx.Process(target=multi_worker, args=(spec, alias, i, barrier, queue))
                   for i in range(spec["procs"])]
        for worker in workers:
            worker.start()
        parts = [queue.get(timeout=3 * BARRIER_WAIT) for _ in workers]
        for worker in workers:
            worker.join(60)
        errors = [p[4] for p in parts if p[4]]
        if errors:
            raise RuntimeError(f"{alias}: a worker failed:\n{errors[0]}")
        merged = [stat.merge_samples(array("q", p[3][i]) for p in parts)
                  for i in range(len(ACTIONS))]
        out[alias] = {"span_s": (max(p[2] for p in parts) - min(p[1] for p in parts)) / 1e9}
        for action, samples in zip(ACTIONS, merged, strict=True):
            out[alias][f"{action}_p50_ns"] = stat.percentile(samples, 50) if samples else None
        out[alias]["counts"] = {a: len(s) for a, s in zip(ACTIONS, merged, strict=True)}
    return out


def child_main(spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    result = (run_percall if spec["measure"] == "percall" else run_multi)(spec)
    Path(spec["result"]).write_text(json.dumps(result))


# --- the parent: trees, rounds, report ------------------------------------------------


def git(*args: str, cwd: Path = HERE) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def default_trees_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "djcachebench" / "gate-trees"


def baseline_tree(commit: str, trees: Path) -> Path:
    """A detached worktree of ``commit`` under ``trees``, reused while it is unchanged."""
    path = trees / commit
    if path.exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, text=True,
                              capture_output=True, check=False).stdout.strip()
        if head == commit and not git("status", "--porcelain", cwd=path):
            return path
        remove_tree(path)
    trees.mkdir(parents=True, exist_ok=True)
    git("worktree", "prune")  # a registered worktree whose folder was deleted blocks `add`
    git("worktree", "add", "--detach", str(path), commit)
    return path


def remove_tree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=HERE,
                   capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)
    git("worktree", "prune")


def run_child(tree: Path, measure: str, settings: dict[str, Any]) -> dict[str, Any]:
    """One measure of one tree, in a child whose ``djcachebench`` is ``tree``'s."""
    work = Path(tempfile.mkdtemp(prefix="djcb-gate-"))
    try:
        spec = {**settings, "measure": measure, "tree": str(tree),
                "workdir": str(work / "stores"), "result": str(work / "result.json")}
        (work / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                               str(work / "spec.json")], env=env, text=True,
                              capture_output=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the {measure} child of {tree} failed:\n{done.stderr[-4000:]}")
        return json.loads((work / "result.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {"values": list(values), "median": median(values),
            "min": min(values), "max": max(values)}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def compared(measure: str, target: str, figure: str) -> dict[str, Any]:
        sides = {side: [r[measure][side][target][figure] for r in rounds]
                 for side in ("baseline", "current")}
        ratios = [c / b for b, c in zip(sides["baseline"], sides["current"], strict=True)]
        return {"baseline": median(sides["baseline"]), "current": median(sides["current"]),
                "ratio": spread(ratios)}

    percall = {f"{t} {a}": compared("percall", t, f"{a}_ns")
               for t in ("sqlite", "tiered") for a in ("get", "set")}
    multi = {row_name(t, f): compared("multi", t, f) for t, f in MULTI_ROWS}
    in_run = {label: {side: spread([r["multi"][side][n[0]][n[1]] / r["multi"][side][d[0]][d[1]]
                                    for r in rounds])
                      for side in ("baseline", "current")}
              for label, n, d in IN_RUN}
    return {"percall": percall, "multi": multi, "in_run": in_run}


def row_name(target: str, figure: str) -> str:
    return f"{target} {figure.removesuffix('_s').removesuffix('_ns').replace('_', ' ')}"


def show(figure: str, value: float) -> str:
    return f"{value:.3f} s" if figure.endswith("_s") else stats().format_ns(value)


def ratio_cells(r: dict[str, Any]) -> str:
    rounds = " ".join(f"{v:.3f}" for v in r["values"])
    return f"{rounds:<30} {r['median']:>6.3f}  {r['min']:.3f}-{r['max']:.3f}"


def report(result: dict[str, Any], write: Callable[[str], None]) -> None:
    s, a, b = result["summary"], result["baseline"]["name"], result["current"]["name"]
    opts = result["settings"]
    machine = result["machine"]
    write(f"A = baseline {result['baseline']['commit'][:12]}, B = current {b} "
          f"({result['current']['tree']}); {machine['cpus']} CPUs, load average at the end "
          + ", ".join(f"{x:.1f}" for x in machine["load"]))
    write("")
    head = f"{'measure':<22} {a:>10} {b:>10}  {'current/baseline per round':<30} median  spread"
    write(f"Per call, one process: median a call ({opts['ops']:,} ops a round, "
          f"{opts['rounds']} rounds, A B then B A)")
    write(head)
    for name, row in s["percall"].items():
        write(f"{name:<22} {show('ns', row['baseline']):>10} {show('ns', row['current']):>10}  "
              f"{ratio_cells(row['ratio'])}")
    write("")
    write(f"{opts['procs']} processes, {opts['proc_ops']:,} ops each: span and merged p50 "
          f"(* same code in both runs: its ratio is the noise)")
    write(head)
    for (target, figure), (name, row) in zip(MULTI_ROWS, s["multi"].items(), strict=True):
        label = name + (" *" if target in SAME_CODE else "")
        write(f"{label:<22} {show(figure, row['baseline']):>10} "
              f"{show(figure, row['current']):>10}  {ratio_cells(row['ratio'])}")
    write("")
    write(f"In-run ratios, {opts['procs']} processes: median (min-max) over rounds")
    write(f"{'ratio':<36} {a:>22} {b:>22}")
    for label, sides in s["in_run"].items():
        cells = [f"{x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f})"
                 for x in (sides["baseline"], sides["current"])]
        write(f"{label:<36} {cells[0]:>22} {cells[1]:>22}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the commit to compare to")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, A B then B A")
    parser.add_argument("--ops", type=int, default=200_000, help="per-call ops a round")
    parser.add_argument("--proc-ops", type=int, default=20_000,
                        help="ops of each process in the multi-process run")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1_000, help="untimed ops first")
    parser.add_argument("--quick", action="store_true",
                        help="a check that the gate works: tiny runs, 1 round, 2 processes")
    parser.add_argument("--out", type=Path, help="the JSON results (default: a temp dir)")
    parser.add_argument("--trees", type=Path, default=default_trees_dir(),
                        help="where the baseline's worktree is kept, by commit hash")
    parser.add_argument("--remove-tree", action="store_true",
                        help="remove the baseline's worktree after the run")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.ops, args.proc_ops, args.procs, args.warmup = 1, 2_000, 300, 2, 100
    for name in ("rounds", "ops", "proc_ops", "procs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child)
        return
    if shutil.which("git") is None:
        raise SystemExit("the gate needs git (it checks out the baseline in a worktree)")
    commit = git("rev-parse", "--verify", f"{args.baseline}^{{commit}}")
    current = git("rev-parse", "HEAD")
    tree = baseline_tree(commit, args.trees)
    trees = {"baseline": tree, "current": HERE}
    settings = {"ops": args.ops, "proc_ops": args.proc_ops, "procs": args.procs,
                "warmup": args.warmup, "rounds": args.rounds, "seed": SEED, "keys": KEYS,
                "value_sizes": list(VALUE_SIZES), "mix": MIX, "key_limit": KEY_LIMIT}
    out = args.out or Path(tempfile.mkdtemp(prefix="djcb-gate-out-")) / "gate.json"
    rounds: list[dict[str, Any]] = []
    try:
        for index in range(args.rounds):
            order = ("baseline", "current") if index % 2 == 0 else ("current", "baseline")
            done: dict[str, Any] = {"order": list(order), "percall": {}, "multi": {}}
            for measure in ("percall", "multi"):
                for side in order:
                    done[measure][side] = run_child(trees[side], measure, settings)
            rounds.append(done)
            calls = done["percall"]
            per = [calls["current"][t][f"{a}_ns"] / calls["baseline"][t][f"{a}_ns"]
                   for t in ("sqlite", "tiered") for a in ("get", "set")]
            print(f"round {index + 1} ({' '.join('AB'[s == 'current'] for s in order)}): "
                  f"current/baseline per call: sqlite get {per[0]:.3f} set {per[1]:.3f}, "
                  f"tiered get {per[2]:.3f} set {per[3]:.3f}", file=sys.stderr, flush=True)
    finally:
        if args.remove_tree:
            remove_tree(tree)
    # Only what the children run counts: an edit to the docs or the tests is not a change
    # of the tree under test.
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "djcachebench",
                     "bench/gate.py"))
    result = {
        "gate": 1,
        "baseline": {"commit": commit, "name": commit[:7], "tree": str(tree)},
        "current": {"commit": current, "name": current[:7] + ("+" if dirty else ""),
                    "dirty": dirty, "tree": str(HERE)},
        "settings": settings,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load": list(os.getloadavg())},
        "rounds": rounds,
        "summary": summarise(rounds),
    }
    report(result, print)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
