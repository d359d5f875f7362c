"""The instruments under bench/ that nothing else runs still report what they claim to.

Why: ``docs/benchmarks.md`` quotes figures from ``bench/l1_ab.py``,
``bench/l1_share.py``, ``bench/row_layouts.py``, ``bench/sizes.py``,
``bench/get_scale.py``, ``bench/key_layouts.py``, ``bench/mutable_values.py``,
``bench/request_cost.py``, ``bench/gate.py``, ``bench/wal_bound.py`` and
``bench/miss_cost.py``; nothing else runs them, and a change to the caches or to the
settings the scripts build would otherwise only show when someone next needs the
figures. Tiny runs: the numbers are not checked, their presence, their consistency and
the bounds they must respect are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run(tmp_path: Path, script: str, *args: str) -> str:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the scripts' stores go here
    done = subprocess.run([sys.executable, str(BENCH / script), *args], env=env, text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_l1_ab_reports_both_sides_per_round(tmp_path: Path) -> None:
    out = _run(tmp_path, "l1_ab.py", "--keys", "2000", "--per", "1", "--ops", "400",
               "--rounds", "2", "--l1", "100", "--zipf", "1")
    rounds = re.findall(r"^round (\d): sqlite get ([\d.]+) set ([\d.]+) delete ([\d.]+) µs; "
                        r"tiered get ([\d.]+) set ([\d.]+) delete ([\d.]+) µs; "
                        r"CPU sqlite / tiered ([\d.]+); L1 answered ([\d.]+)%, "
                        r"misses kept out ([\d,]+), L1 entries ([\d,]+)$", out, re.M)
    assert [r[0] for r in rounds] == ["1", "2"], out
    for row in rounds:
        assert all(float(x) > 0 for x in row[1:8]), row
        assert 0 < float(row[8]) < 100  # Zipf keys: some reads answered, not all
        assert int(row[10].replace(",", "")) <= 100  # one tiered worker, L1 of 100
    summary = re.search(r"^CPU sqlite / tiered per round: ([\d.]+), ([\d.]+)$", out, re.M)
    assert summary is not None and list(summary.groups()) == [r[7] for r in rounds]


def test_miss_cost_reports_kept_and_unkept_misses_per_round(tmp_path: Path) -> None:
    out = _run(tmp_path, "miss_cost.py", "--keys", "6000", "--batch", "200", "--rounds", "2")
    rounds = re.findall(r"^round (\d): plain read ([\d.]+) µs, miss kept ([\d.]+) µs "
                        r"\(([\d.]+)x, L1 entries (\d+)\); plain read ([\d.]+) µs, miss let "
                        r"through ([\d.]+) µs \(([\d.]+)x, L1 entries added (\d+)\)$", out, re.M)
    assert [r[0] for r in rounds] == ["1", "2"], out
    for row in rounds:
        assert all(float(x) > 0 for x in row[1:4] + row[5:8]), row
        assert int(row[4]) == 200  # every miss of the first batch was kept
        assert int(row[8]) < 200  # the closed gate keeps (nearly) none of the second
    assert re.search(r"^median: miss kept [\d.]+x a plain read, miss let through [\d.]+x$",
                     out, re.M), out


@pytest.mark.slow
def test_l1_share_reports_shares_ceiling_and_cpu_split(tmp_path: Path) -> None:
    out = _run(tmp_path, "l1_share.py", "--keys", "2000", "--procs", "2", "--ops", "400",
               "--rounds", "1", "--l1", "100")
    share = re.search(r"answered by the L1 ([\d.]+)%, by an ideal L1 ([\d.]+)%", out)
    assert share is not None, out
    assert 0 < float(share.group(1)) <= 100 and 0 < float(share.group(2)) <= 100
    assert re.search(r"ceiling of an L1 whose hits cost nothing ([\d.]+)x", out)
    for name in ("sqlite", "tiered"):
        split = re.search(rf"^  {name} CPU seconds: gets ([\d.]+), sets ([\d.]+), deletes "
                          r"([\d.]+), the rest of the loop (-?[\d.]+)$", out, re.M)
        assert split is not None, (name, out)
        assert float(split.group(1)) > 0


def test_row_layouts_reports_each_layout_per_size(tmp_path: Path) -> None:
    out = _run(tmp_path, "row_layouts.py", "--sizes", "300,2000", "--keys", "200",
               "--reads", "200")
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["300", "2000"], out
    assert all(float(x) > 0 for r in rows for x in r[1:]), out


def test_sizes_reports_both_caches_at_many_keys(tmp_path: Path) -> None:
    out = _run(tmp_path, "sizes.py", "--cases", "2KB,dict10KB", "--keys", "50",
               "--rounds", "1")
    assert "keys=50" in out, out
    for case in ("2KB", "dict10KB"):
        sqlite = re.search(rf"^\s+{case}\s+sqlite\s+\S+\s+\S+\s+([\d.]+)\s+([\d.]+)$", out, re.M)
        disk = re.search(rf"^\s+{case}\s+diskcache\s+\S+\s+\S+$", out, re.M)
        assert sqlite is not None and disk is not None, out
        assert float(sqlite.group(1)) > 0 and float(sqlite.group(2)) > 0


@pytest.mark.servers
def test_strict_writes_cost_reports_each_kind_of_set(tmp_path: Path) -> None:
    out = _run(tmp_path, "strict_writes.py", "cost", "--others", "1", "--calls", "60",
               "--rounds", "2", "--lease", "0.5")
    for name in ("redis set", "tiered cluster set", "tiered strict set"):
        row = re.search(rf"^{name}\s+p50\s+([\d.]+) us \(([\d.]+)x redis\)", out, re.M)
        assert row is not None and float(row.group(1)) > 0, out
    confirmed = re.search(r"^strict: (\d+) writes confirmed, hosts acked (\d+), excluded (\d+), "
                          r"unconfirmed (\d+)", out, re.M)
    assert confirmed is not None, out
    writes, acked, excluded, unconfirmed = (int(x) for x in confirmed.groups())
    assert writes == 60 and acked + excluded == 60 and unconfirmed == 0


def test_get_scale_floor_reports_the_select_and_the_tag_at_both_counts(tmp_path: Path) -> None:
    out = _run(tmp_path, "get_scale.py", "--keys", "3000", "--blocks", "4", "--block", "100",
               "--warm", "200", "--floor", "--dir", str(tmp_path / "caches"))
    got = re.search(r"get p50 .*: 1,100 keys ([\d.]+) µs, 3,000 keys ([\d.]+) µs, ratio", out)
    floor = re.search(r"^floor: the engine's SELECT alone ([\d.]+) µs at 1,100 keys, ([\d.]+) µs "
                      r"at 3,000; the tag check at 3,000 keys ([\d.]+) µs .*; least growth "
                      r"(-?[\d.]+) µs against the ([\d.]+) µs", out, re.M)
    assert got is not None and floor is not None, out
    few_get, select_few, select_many, tag = (float(got.group(1)), *map(float, floor.groups()[:3]))
    assert 0 < select_few < few_get and select_many > 0 and tag > 0
    assert float(floor.group(5)) == pytest.approx(few_get / 2, abs=0.06)


def test_key_layouts_reports_both_layouts(tmp_path: Path) -> None:
    out = _run(tmp_path, "key_layouts.py", "--keys", "3000", "--reads", "300", "--warm", "300",
               "--dir", str(tmp_path / "layouts"))
    rows = re.findall(r"^\s*(text|hashed): 1,100 keys ([\d.]+) µs, 3,000 keys ([\d.]+) µs, "
                      r"growth ([-+][\d.]+) µs", out, re.M)
    assert [r[0] for r in rows] == ["text", "hashed"], out
    assert all(float(x) > 0 for r in rows for x in r[1:3]), out


def test_wall_bound_charges_the_l1_target_the_l2_targets_writes(tmp_path: Path) -> None:
    """bench/wall_bound.py: the L1 target keeps its own reads and the time outside
    its calls, and takes the L2 target's writes; the ratio is to the L2's whole."""
    def backend(name: str, wall: float, get: float, set_: float, delete: float) -> dict:
        actions = {a: {"count": 1, "total_ns": int(s * 1e9)}
                   for a, s in (("get", get), ("set", set_), ("delete", delete))}
        return {"name": name, "wall_s": wall, "actions": actions}

    results = {"run": {"procs": 4}, "backends": [
        backend("sqlite", 10.0, 20.0, 10.0, 2.0),   # outside calls: 40 - 32 = 8
        backend("tiered", 9.0, 5.0, 20.0, 3.0),     # outside calls: 36 - 28 = 8
    ]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    out = _run(tmp_path, "wall_bound.py", str(path))
    row = re.search(r"results\.json\s+([\d.]+) /\s+([\d.]+)\s+([\d.]+) /\s+([\d.]+)\s+"
                    r"([\d.]+) /\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert row is not None, out
    # reads 5 / 20, writes 23 / 12, outside 8 / 8, wall 0.90,
    # bound (5 + 12 + 8) / (32 + 8) = 0.625
    assert [float(x) for x in row.groups()] == [5.0, 20.0, 23.0, 12.0, 8.0, 8.0, 0.9, 0.62]
    missing = subprocess.run([sys.executable, str(BENCH / "wall_bound.py"), str(path),
                              "--l1", "nope"], text=True, capture_output=True, check=False)
    assert missing.returncode != 0 and "nope not in this run" in missing.stderr


def test_mutable_values_reports_sets_and_refills_per_round(tmp_path: Path) -> None:
    out = _run(tmp_path, "mutable_values.py", "--size", "2000", "--keys", "20",
               "--rounds", "2")
    rows = re.findall(r"^(\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                      r"([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["1", "2"], out
    for row in rows:
        assert all(float(x) > 0 for x in row[1:]), row
        assert float(row[3]) == pytest.approx(float(row[2]) / float(row[1]), abs=0.01)
    # Every timed tiered read was a refill from the store (another writer ended its copy).
    assert re.search(r"\(tiered: 40 reads from the store, 0 L1 hits\)$", out, re.M), out


def test_request_cost_reports_each_target_per_round(tmp_path: Path) -> None:
    out = _run(tmp_path, "request_cost.py", "--backends", "locmem,sqlite", "--requests", "20",
               "--rounds", "2")
    rounds = re.findall(r"^round (\d): locmem ([\d.]+) µs, sqlite ([\d.]+) µs; "
                        r"sqlite ([\d.]+)$", out, re.M)
    assert [r[0] for r in rounds] == ["1", "2"], out
    for _, locmem, sqlite, ratio in rounds:
        assert float(locmem) > 0 and float(sqlite) > 0
        assert float(ratio) == pytest.approx(float(sqlite) / float(locmem), abs=0.01)
    summary = re.search(r"^sqlite / locmem: median ([\d.]+) \(rounds ([\d.]+)-([\d.]+)\)$",
                        out, re.M)
    assert summary is not None, out
    ratios = sorted(float(r[3]) for r in rounds)
    assert float(summary.group(2)) == pytest.approx(ratios[0], abs=0.002)
    assert float(summary.group(3)) == pytest.approx(ratios[1], abs=0.002)


@pytest.mark.skipif(shutil.which("git") is None, reason="bench/gate.py checks out its baseline "
                    "with git, which is not installed")
def test_gate_quick_compares_a_worktree_of_head_with_this_tree(tmp_path: Path) -> None:
    """bench/gate.py --quick: the baseline's worktree is made and removed, both trees
    run every measure, the tables have every row and the JSON every field."""
    out = _run(tmp_path, "gate.py", "--quick", "--baseline", "HEAD",
               "--trees", str(tmp_path / "trees"), "--remove-tree",
               "--out", str(tmp_path / "gate.json"))
    figure = r"[\d.,]+ ?[a-zµ]+"  # 8.29µs, 0.015 s
    ratio = rf"\s+{figure}\s+{figure}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)-([\d.]+)$"
    for row in ("sqlite get", "sqlite set", "tiered get", "tiered set", "sqlite span",
                "sqlite get p50", "sqlite set p50", "tiered span", "tiered get p50",
                "tiered set p50", r"floor span \*", r"diskcache get p50 \*", r"locmem get p50 \*"):
        assert re.search(rf"^{row}{ratio}", out, re.M), (row, out)
    for label in ("sqlite span / floor span", "sqlite get p50 / diskcache get p50",
                  "tiered get p50 / locmem get p50", "tiered set p50 / sqlite set p50",
                  "tiered span / sqlite span"):
        assert re.search(rf"^{re.escape(label)}(\s+[\d.]+ \([\d.]+-[\d.]+\)){{2}}$", out, re.M), out
    assert f"results: {tmp_path / 'gate.json'}" in out
    result = json.loads((tmp_path / "gate.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, text=True,
                          capture_output=True, check=True).stdout.strip()
    assert result["baseline"]["commit"] == result["current"]["commit"] == head
    assert result["settings"]["rounds"] == 1 and result["settings"]["procs"] == 2
    (round_,) = result["rounds"]
    assert round_["order"] == ["baseline", "current"]
    for side in ("baseline", "current"):
        for target in ("sqlite", "tiered"):
            assert set(round_["percall"][side][target]) >= {"get_ns", "set_ns", "counts"}
        for target in ("sqlite", "tiered", "floor", "diskcache", "locmem"):
            figures = round_["multi"][side][target]
            assert set(figures) >= {"span_s", "get_p50_ns", "set_p50_ns", "counts"}
            assert sum(figures["counts"].values()) == 2 * 300  # both workers' every op
    summary = result["summary"]
    assert set(summary["percall"]) == {"sqlite get", "sqlite set", "tiered get", "tiered set"}
    assert all(set(row["ratio"]) == {"values", "median", "min", "max"}
               for row in (*summary["percall"].values(), *summary["multi"].values()))
    assert set(summary["in_run"]["tiered span / sqlite span"]) == {"baseline", "current"}
    # The baseline's worktree is gone, and git no longer lists it.
    assert not (tmp_path / "trees" / head).exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=BENCH, text=True,
                            capture_output=True, check=True).stdout
    assert str(tmp_path / "trees") not in listed

@pytest.mark.slow
def test_wal_bound_reports_each_tree_per_reader_count_alternated(tmp_path: Path) -> None:
    """bench/wal_bound.py against a tree (here this one again), A B B A: a row per
    tree and reader count, the percentiles in order, the JSON the same figures."""
    out = _run(tmp_path, "wal_bound.py", "--seconds", "0.5", "--readers", "0,1", "--writers",
               "2", "--keys", "200", "--compare", str(BENCH.parent),
               "--json", str(tmp_path / "wal.json"))
    phases = re.findall(r"^  readers (\d) phase (\d)/4 tree ([AB]):", out, re.M)
    assert [(r, t) for r, _, t in phases] == [(r, t) for r in "01" for t in "ABBA"], out
    rows = re.findall(r"^([AB])\s+(\d)\s+([\d.]+) MiB\s+([\d,]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$",
                      out, re.M)
    assert [(r[0], r[1]) for r in rows] == [("A", "0"), ("B", "0"), ("A", "1"), ("B", "1")], out
    for row in rows:
        assert float(row[2]) > 0 and int(row[4]) <= int(row[5]) <= int(row[6]), row
    assert re.search(r"^B / A, every reader count: p50 [\d.]+x, p99 [\d.]+x, p99.9 [\d.]+x$",
                     out, re.M), out
    figures = json.loads((tmp_path / "wal.json").read_text())
    assert len(figures["rows"]) == 4 and set(figures["trees"]) == {"A", "B"}
