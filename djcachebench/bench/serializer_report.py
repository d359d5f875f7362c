"""``djcachebench serializers``: serialize/deserialize time and stored bytes per value kind.

Why a report of its own: inside a cache benchmark a serializer's cost is
mixed with the round trip, the lock and the copy, and the difference between
pickle and msgpack is a few percent of a call or most of it depending on the
value. This measures the serializers alone, on the same values the scenarios
store (:mod:`djcachebench.bench.values`), so a reader can tell which part of a
``sqlite[pickle]`` vs ``sqlite[msgpack]`` difference is the serializer.

Per (serializer, value kind): the median over ``--rounds`` rounds of the time
per value to ``dumps`` and to ``loads`` a pool of values, the serialized
bytes per value, and whether the value came back equal (msgpack returns
tuples as lists and refuses ``datetime``/``Decimal``: the ``rows`` kind, as
Django's ``.values()`` gives it). What ShardedSQLiteCache stores is said too:
``bytes`` and ``str`` are stored as they are (UTF-8), whatever the serializer,
and 64-bit ``int`` as 8 bytes (all sealed); django-redis stores ``int`` as is too.
Serializers come from the project's one registry
(:func:`djcachebench.serializers.load_serializer`), so a dotted path a user
would put in ``SERIALIZER`` is measured the same way.

Writes ``serializers.json`` (schema family of ``results.json``: version,
machine, command), ``serializers.md`` and ``serializers.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from random import Random
from typing import Any

from djcachebench.bench.argtypes import prepare_out_dir
from djcachebench.bench.results import SCHEMA_VERSION, machine_info, utc_now
from djcachebench.bench.values import KINDS, SizeError, build_pool, parse_size, value_size
from djcachebench.serializers import load_serializer

HELP = "time serializers (pickle, msgpack, a dotted path) per value kind; stored bytes"
#: What ShardedSQLiteCache does with each kind, whatever SERIALIZER says.
STORED_AS = {
    "bytes": "as is (raw)",
    "str": "as is (UTF-8)",
    "int": "as 8 bytes",
    "dict": "serialized",
    "rows": "serialized",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serializer",
        default=None,
        help="comma-separated: pickle, msgpack, or dotted paths (default pickle,msgpack: "
        "those installed)",
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"value kinds (default {','.join(KINDS)})"
    )
    parser.add_argument("--size", default="10k", help="value size (default 10k, as JSON)")
    parser.add_argument("--values", type=int, default=32, help="values per kind (32)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds; median (15)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default bench/results/DATE-serializers)")


def measure(serializer_name: str, kind: str, size: int, count: int, rounds: int) -> dict[str, Any]:
    """One row of the report (see the module doc)."""
    serializer = load_serializer(serializer_name)
    values = build_pool(kind, "fixed", size, size, count, 0)
    row: dict[str, Any] = {
        "serializer": serializer_name,
        "kind": kind,
        "value_bytes": round(statistics.median(value_size(v) for v in values)),
        "stored_by_sqlite": STORED_AS[kind],
    }
    try:
        blobs = [serializer.dumps(v) for v in values]
        back = [serializer.loads(b) for b in blobs]
    except Exception as exc:  # the finding: this serializer cannot store this kind
        return {**row, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
    dumps, loads = serializer.dumps, serializer.loads
    dump_ns, load_ns = [], []
    order = Random(0)
    for _ in range(rounds):
        # Alternate which half goes first, so neither always runs on a cold cache line.
        if order.random() < 0.5:
            dump_ns.append(_time_each(dumps, values))
            load_ns.append(_time_each(loads, blobs))
        else:
            load_ns.append(_time_each(loads, blobs))
            dump_ns.append(_time_each(dumps, values))
    return {
        **row,
        "ok": True,
        "error": None,
        "dumps_ns": round(statistics.median(dump_ns)),
        "loads_ns": round(statistics.median(load_ns)),
        "bytes": round(statistics.median(len(b) for b in blobs)),
        "round_trip_equal": back == list(values),
    }


def _time_each(call: Any, items: list[Any] | tuple[Any, ...]) -> float:
    start = time.perf_counter_ns()
    for item in items:
        call(item)
    return (time.perf_counter_ns() - start) / len(items)


#: What ``--serializer`` measures when not given: those of them that load here.
DEFAULT_SERIALIZERS = ("pickle", "msgpack")


def run(args: argparse.Namespace, command: list[str]) -> int:
    """Measure, then write serializers.json/.md/.png; usage errors exit 2 before any file.

    A serializer named on the command line that cannot be loaded is an error;
    one of the defaults is skipped with a line saying so (msgpack is an
    extra: a plain install must not fail by default, after creating an empty
    output folder).
    """
    try:
        size = parse_size(args.size)
    except SizeError as exc:
        print(f"djcachebench serializers: error: {exc}")
        return 2
    given = args.serializer is not None
    names = ([n.strip() for n in args.serializer.split(",") if n.strip()] if given
             else list(DEFAULT_SERIALIZERS))  # fmt: skip
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        print(f"djcachebench serializers: error: unknown kinds {unknown}; known: {KINDS}")
        return 2
    loaded = []
    for name in names:
        try:
            load_serializer(name)
        except (ImportError, AttributeError, TypeError) as exc:
            if given:
                print(f"djcachebench serializers: error: {name!r} cannot be loaded: {exc}")
                return 2
            print(f"{name}: skipped, cannot be loaded: {exc} "
                  f"(pip install 'djcachebench[{name}]')")
            continue
        loaded.append(name)
    from djcachebench.bench.cli import default_out_dir  # cli imports this module lazily

    out = args.out if args.out is not None else default_out_dir("serializers")
    prepare_out_dir(out)  # a file there is a usage error (exit 2), before measuring
    rows = [measure(name, kind, size, args.values, args.rounds)
            for name in loaded for kind in kinds]  # fmt: skip
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": "serializers",
        "created": utc_now(),
        "command": command,
        "machine": machine_info(),
        "size": size,
        "values": args.values,
        "rounds": args.rounds,
        "rows": rows,
    }
    path = out / "serializers.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    table = render_markdown(data)
    (out / "serializers.md").write_text(table)
    print(table, end="")
    chart = _plot(data, out / "serializers.png")
    print(f"\nresults: {path}" + (f"\nchart:   {chart}" if chart else ""))
    return 0


def render_markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    out = [
        f"# Serializers: {data['size']:,}-byte values (as JSON), {data['values']} values a kind",
        "",
        f"Run {data['created']} with `{' '.join(data['command'])}`; {m.get('cpu_model')}, "
        f"{m.get('python')}. Times: median of {data['rounds']} rounds, per value.",
        "",
        "| Serializer | Kind | Value (JSON bytes) | dumps | loads | Stored bytes | "
        "Equal after loads | ShardedSQLiteCache stores it |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in data["rows"]:
        if r["ok"]:
            figures = (
                f"{r['dumps_ns'] / 1000:.1f} µs | {r['loads_ns'] / 1000:.1f} µs | "
                f"{r['bytes']:,} | {'yes' if r['round_trip_equal'] else 'no'}"
            )
        else:
            figures = f"fails: {r['error']} | - | - | -"
        out.append(
            f"| {r['serializer']} | {r['kind']} | {r['value_bytes']:,} | {figures} | "
            f"{r['stored_by_sqlite']} |"
        )
    return "\n".join(out) + "\n"


def _plot(data: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in data["rows"] if r["ok"]]
    kinds = list(dict.fromkeys(r["kind"] for r in data["rows"]))
    names = list(dict.fromkeys(r["serializer"] for r in data["rows"]))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8))
    width = 0.8 / max(len(names), 1)
    for ax, field, title in zip(
        axes,
        ("dumps_ns", "loads_ns", "bytes"),
        ("dumps per value (µs)", "loads per value (µs)", "serialized bytes per value"),
        strict=True,
    ):
        for j, name in enumerate(names):
            got = {r["kind"]: r[field] for r in rows if r["serializer"] == name}
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(kinds))]
            scale = 1 if field == "bytes" else 1000
            heights = [got.get(k, 0) / scale for k in kinds]
            bars = ax.bar(xs, heights, width, label=name.rpartition(".")[2])
            for bar, kind in zip(bars, kinds, strict=True):
                if kind not in got:
                    ax.annotate("fails", (bar.get_x() + bar.get_width() / 2, 0), ha="center",
                                va="bottom", fontsize=7, rotation=90)  # fmt: skip
        ax.set_xticks(range(len(kinds)))
        ax.set_xticklabels(kinds)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.35)
        ax.set_axisbelow(True)
    axes[0].legend(title="serializer", fontsize=8)
    m = data["machine"]
    fig.suptitle(
        f"Serializers on {data['size']:,}-byte values (JSON size; int: a counter); "
        f"median of {data['rounds']} rounds; {m.get('cpu_model')}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
