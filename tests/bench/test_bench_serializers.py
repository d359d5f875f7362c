"""Serializers as a dimension: target variants, and the serializer report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from djcachebench.bench.cli import main
from djcachebench.bench.serializer_report import measure
from djcachebench.bench.targets import (
    SerializerUnsupported,
    TargetEnv,
    apply_serializer,
    load_targets,
    select_targets,
    serializer_variants,
)

ENV = TargetEnv(Path("/tmp/x"), {"redis": "redis://127.0.0.1:1/0", "memcached": "127.0.0.1:1"})


def _target(name: str):  # type: ignore[no-untyped-def]
    return select_targets(load_targets(), [name])[0]


def test_each_backend_gets_the_serializer_its_own_way() -> None:
    sqlite = apply_serializer(_target("sqlite").caches(ENV), "msgpack")
    assert sqlite["OPTIONS"]["SERIALIZER"] == "msgpack"
    assert sqlite["OPTIONS"]["MAX_ENTRIES"] == 1000  # the rest of the settings kept
    tiered = apply_serializer(_target("tiered").caches(ENV), "msgpack")
    assert tiered["OPTIONS"]["L2"]["OPTIONS"]["SERIALIZER"] == "msgpack"  # the L2 stores
    redis = apply_serializer(_target("redis").caches(ENV), "msgpack")
    assert redis["OPTIONS"]["SERIALIZER"] == "django_redis.serializers.msgpack.MSGPackSerializer"
    dotted = apply_serializer(_target("sqlite").caches(ENV), "myproject.serializers.Json")
    assert dotted["OPTIONS"]["SERIALIZER"] == "myproject.serializers.Json"
    with pytest.raises(SerializerUnsupported, match="takes only the serializers"):
        apply_serializer(_target("redis").caches(ENV), "myproject.serializers.Json")
    with pytest.raises(SerializerUnsupported, match="no serializer option"):
        apply_serializer(_target("locmem").caches(ENV), "msgpack")
    # Every backend without the option pickles: pickle is always accepted, unchanged.
    locmem = _target("locmem").caches(ENV)
    assert apply_serializer(locmem, "pickle") == locmem


def test_variants_are_named_per_serializer_and_unsupported_ones_say_why() -> None:
    targets = select_targets(load_targets(), ["locmem", "sqlite"])
    variants = serializer_variants(targets, ["pickle", "msgpack"])
    assert [v.name for v in variants] == [
        "locmem[pickle]",
        "locmem[msgpack]",
        "sqlite[pickle]",
        "sqlite[msgpack]",
    ]
    assert [bool(v.unsupported) for v in variants] == [False, True, False, False]
    assert "msgpack" in variants[3].modules
    assert serializer_variants(targets, None) == targets


def test_report_rows_time_sizes_and_failures() -> None:
    pickled = measure("pickle", "dict", 2_000, 4, 3)
    assert pickled["ok"] and pickled["round_trip_equal"]
    assert pickled["dumps_ns"] > 0 and pickled["loads_ns"] > 0 and pickled["bytes"] > 500
    assert pickled["stored_by_sqlite"] == "serialized"
    rows = measure("msgpack", "rows", 2_000, 4, 3)  # datetime and Decimal fields
    assert not rows["ok"] and "datetime" in rows["error"]
    assert measure("msgpack", "bytes", 2_000, 4, 3)["stored_by_sqlite"] == "as is (raw)"


def test_serializers_command_writes_its_files(tmp_path: Path) -> None:
    code = main(["serializers", "--size", "1k", "--values", "4", "--rounds", "3",
                 "--kinds", "dict,int", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    data = json.loads((tmp_path / "serializers.json").read_text())
    assert data["kind"] == "serializers"
    assert {(r["serializer"], r["kind"]) for r in data["rows"]} == {
        ("pickle", "dict"), ("pickle", "int"), ("msgpack", "dict"), ("msgpack", "int"),
    }  # fmt: skip
    assert "| msgpack | dict |" in (tmp_path / "serializers.md").read_text()


@pytest.mark.slow
def test_bench_runs_a_target_per_serializer(tmp_path: Path) -> None:
    code = main(["bench", "--scenario", "api-json", "--procs", "1", "--ops", "50",
                 "--warmup", "10", "--keys", "50", "--backends", "locmem,sqlite",
                 "--serializer", "pickle,msgpack", "--no-plot",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    ran = {b["name"]: b for b in data["backends"]}
    assert set(ran) == {"locmem[pickle]", "sqlite[pickle]", "sqlite[msgpack]"}
    assert all(a["errors"] == 0 for b in ran.values() for a in b["actions"].values())
    settings = data["targets"]["sqlite[msgpack]"]["settings"]["CACHES"]["default"]
    assert settings["OPTIONS"]["SERIALIZER"] == "msgpack"
    assert [s["name"] for s in data["skipped"]] == ["locmem[msgpack]"]


def test_a_default_serializer_that_is_not_installed_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the msgpack extra, the command's defaults skip msgpack, not fail
    (exit 2) after creating an empty folder in the working directory. A serializer
    named on the command line that cannot load is still an error."""
    import sys

    monkeypatch.setitem(sys.modules, "msgpack", None)  # its import now fails
    monkeypatch.chdir(tmp_path)
    code = main(["serializers", "--size", "1k", "--values", "4", "--rounds", "3",
                 "--kinds", "int"])  # fmt: skip
    assert code == 0
    assert "msgpack: skipped" in capsys.readouterr().out
    (written,) = (tmp_path / "bench" / "results").glob("*-serializers/serializers.json")
    data = json.loads(written.read_text())
    assert {r["serializer"] for r in data["rows"]} == {"pickle"}
    out = tmp_path / "named"
    assert main(["serializers", "--serializer", "msgpack", "--out", str(out)]) == 2
    assert not out.exists()
