"""Bad input is a usage error with a clear message (exit 2), never a traceback or a run.

Each case is one the harness used to accept: a traceback in the parent or a
worker, a comparison of str with int, a timeout that disabled itself, a
command that waited 30 s for servers that could not serve, results written
outside ./bench/results. Nothing here starts a server or a worker: every
value is refused before that.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from djcachebench.bench.cli import build_parser, default_out_dir, main
from djcachebench.bench.paths import default_results_dir
from djcachebench.bench.targets import load_targets, select_targets, serializer_variants

BAD_SCENARIOS = {
    "mixstr": ('mix = "abc"', "mix"),
    "mixval": ('[mix]\nget = "x"', "get"),
    "zipf": ('zipf_s = "x"', "zipf_s"),
    "floatprocs": ("procs = 1.5", "procs"),
    "floatops": ("ops = 10.5", "ops"),
    "strprocs": ('procs = "8"', "procs"),
    "boolprocs": ("procs = true", "procs"),
    "pool": ("value_pool = 1.5", "value_pool"),
    "valmin": ("value_min = 2.5\nvalue_max = 3", "value_min"),
    "nanw": ("[mix]\nget = nan\nset = 1", "get"),
    "infw": ("[mix]\nget = inf\nset = 1", "get"),
    # Finite weights whose sum is not: every fraction was nan, a traceback in the worker.
    "hugew": ("[mix]\nget = 1e308\nset = 1e308", "finite sum"),
    "prefill": ('prefill = "no"', "prefill"),
    "desc": ("description = 5", "description"),
    "bigvalue": ("value_max = 99999999999999", "value_max"),
    "bigkeys": ("keys = 10000000000000", "keys"),
    # Counts below their CLI option's floor (--ops 0 is refused: so is ops = 0).
    "zeroops": ("ops = 0", "ops"),
    "zeroprocs": ("procs = 0", "procs"),
    "zerokeys": ("keys = 0", "keys"),
    "negwarmup": ("warmup = -1", "warmup"),
    "negpool": ("value_pool = -1", "value_pool"),
    "zeroentries": ("max_entries = 0", "max_entries"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCENARIOS))
def test_a_scenario_field_of_the_wrong_type_is_a_usage_error(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body, field = BAD_SCENARIOS[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(f'name = "a"\n{body}\n')
    status = main(["bench", "--scenario", str(path), "--backends", "locmem", "--procs", "1",
                   "--ops", "10", "--out", str(tmp_path / "out"), "--no-plot"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("djcachebench: error: ") and "Traceback" not in err
    assert str(path) in line and field in line, line
    assert not (tmp_path / "out").exists()


def test_a_scenario_of_no_measured_op_is_refused_without_an_ops_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused, rather than run and reported ok with no figure."""
    path = tmp_path / "zero.toml"
    path.write_text('name = "zero"\nprocs = 1\nops = 0\n')
    status = main(["bench", "--scenario", str(path), "--backends", "locmem",
                   "--out", str(tmp_path / "out"), "--no-plot"])  # fmt: skip
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and str(path) in line and "ops must be >= 1, got 0" in line, line
    assert not (tmp_path / "out").exists()


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    # The parser alone: the value must be refused before anything runs.
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--timeout", "-1"],
        ["bench", "--timeout", "nan"],
        ["bench", "--timeout", "inf"],
        ["bench", "--backends", ","],
        ["bench", "--serializer", ","],
        ["bench", "--procs", "1.5"],
        ["bench", "--warmup", "-3"],
        ["bench", "--value-size", "99999999999999999999G"],
        ["sweep", "--vary", "procs=1,2", "--ops", "0"],
        ["sweep", "--vary", "procs=1,2", "--procs", "0"],
        ["sweep", "--vary", "procs=1,2", "--repeat", "0"],
        ["sweep", "--vary", "procs=1,2", "--value-size", "10k-1M-3"],
        ["sweep", "--vary", "procs=1,2", "--timeout", "nan"],
        ["sweep", "--vary", "procs=1,1"],
        ["sweep", "--vary", "value-size=10k,10000"],
        ["http", "--workers", "0"],
        ["http", "--stampede-clients", "0"],
        ["http", "--stampede-clients", "-1"],
        ["http", "--repeat", "0"],
        ["http", "--connections", "0"],
        ["http", "--duration", "0.5"],
        ["http", "--duration", "1.5"],
        ["http", "--compute-seconds", "nan"],
        ["http", "--backends", ","],
        # Processes and threads are bounded: these forked until the machine choked.
        ["http", "--workers", "100000"],
        ["http", "--stampede-clients", "100000"],
        ["bench", "--procs", "100000"],
        ["sweep", "--vary", "keys=1,2", "--procs", "100000"],
        ["stampede", "--procs", "100000"],
        ["stampede", "--threads", "100000"],
        # Durations and connections are bounded too: past the parser, each
        # would fail the backend it measured.
        ["stampede", "--compute", "1e308"],
        ["http", "--connections", "100000000"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_invalid_option_values_are_refused_by_the_parser(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(argv, capsys)
    assert "error: argument" in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["bench", "--serializer", "msgpak"], "--serializer 'msgpak' cannot be loaded"),
        (["bench", "--serializer", "no.such.Serializer"], "No module named 'no'"),
        (["sweep", "--vary", "procs=1,2", "--action", "incr"], "mix has no incr"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_values_no_worker_could_use_are_usage_errors(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt serializer is a usage error, not a failure in every worker
    (exit 1, as if the backend broke), and so is a sweep that charts an action its
    scenario never runs (a table of dashes, exit 0)."""
    status = main([*argv, "--backends", "locmem", "--ops", "10", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert says in err, err
    assert not (tmp_path / "o").exists()


def test_a_stampede_longer_than_the_request_timeout_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --compute-seconds past the request timeout is refused: the run would
    measure client timeouts."""
    from djcachebench.bench.http.gunicorn import gunicorn_missing

    if gunicorn_missing():
        pytest.skip(f"the command stops before checking: {gunicorn_missing()}")
    status = main(["http", "--compute-seconds", "1e6", "--backends", "locmem",
                   "--out", str(tmp_path / "o")])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 2 and "--compute-seconds 1e+06" in out and "at most 100 s" in out, out
    assert not (tmp_path / "o").exists()


def test_op_lists_no_process_could_hold_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ops 50000000`` is refused: each worker's op list (~100 bytes an op)
    would take tens of GiB before the first op."""
    status = main(["bench", "--ops", "50000000", "--backends", "locmem",
                   "--out", str(tmp_path / "o")])  # fmt: skip
    captured = capsys.readouterr()
    assert status == 2, captured
    assert "warmup + ops must be <= 20,000,000 per process" in captured.err + captured.out
    assert not (tmp_path / "o").exists()


def test_an_out_path_that_is_a_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "below"):
        status = main(["bench", "--backends", "locmem", "--procs", "1", "--ops", "10",
                       "--out", str(out), "--no-plot"])  # fmt: skip
        err = capsys.readouterr().err
        assert status == 2 and "Traceback" not in err, err
        assert err.startswith("djcachebench: error: ") and str(afile) in err, err
    status = main(["http", "--backends", "locmem", "--out", str(afile)])
    err = capsys.readouterr().err + capsys.readouterr().out
    assert status == 2 and "Traceback" not in err, err
    # These three name the problem too, rather than raise FileExistsError.
    published = Path(__file__).parents[2] / "bench/results/2026-11-23-reference/results.json"
    for argv in (["stampede", "--backends", "locmem"], ["serializers"],
                 ["plot", str(published)]):
        status = main([*argv, "--out", str(afile)])
        err = capsys.readouterr().err
        assert status == 2 and "is not a folder" in err, (argv, err)


def test_value_sizes_have_a_documented_upper_bound() -> None:
    from djcachebench.bench.values import MAX_VALUE_SIZE, SizeError, parse_size

    assert parse_size("512MiB") == MAX_VALUE_SIZE
    with pytest.raises(SizeError, match="512MiB"):
        parse_size("513MiB")


def test_duplicate_names_run_once() -> None:
    targets = select_targets(load_targets(), ["locmem", "redis", "locmem"])
    variants = serializer_variants(targets, ["pickle", "pickle"])
    names = [t.name for t in variants]
    assert len(names) == len(set(names)) == len(targets)


def test_an_empty_backend_list_is_not_every_target() -> None:
    from djcachebench.bench.targets import TargetError

    with pytest.raises(TargetError):
        select_targets(load_targets(), [])


@pytest.mark.parametrize("name", ["../../../../escaped", "/etc/x", "a/b", "..", ""])
def test_default_out_dir_stays_in_the_results_folder(name: str) -> None:
    out = default_out_dir(name)
    assert out.parent.resolve() == default_results_dir().resolve()
    assert "/" not in out.name and out.name not in (".", "..")


def test_a_swept_or_scenario_process_count_has_the_same_bound(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    from djcachebench.bench.workload import PROCS_PER_CORE, Scenario, ScenarioError, max_procs

    assert max_procs() >= PROCS_PER_CORE
    Scenario(name="ok", procs=max_procs())
    with pytest.raises(ScenarioError, match=r"procs must be <= .* per usable core"):
        Scenario(name="many", procs=max_procs() + 1)
    folder = tmp_path / "sweep"
    status = main(["sweep", "--vary", f"procs=1,{max_procs() + 1}", "--backends", "locmem",
                   "--out", str(folder)])
    out = capsys.readouterr()
    assert status == 2 and "Traceback" not in out.err + out.out, out
    assert "per usable core" in out.err + out.out
    assert not folder.exists()  # refused before anything was written (it was made before)


def test_a_run_that_stores_gigabytes_says_so_before_it_starts() -> None:
    """``--value-size 100k-10M`` stores ~5 GiB in each target (locmem: in each
    worker): the run warns before it starts."""
    from djcachebench.bench.workload import REFERENCE
    from djcachebench.bench.workload import volume_warning as scenario_volume_warning

    assert scenario_volume_warning(REFERENCE) is None
    big = REFERENCE.with_value_size(100_000, 10_000_000)
    warning = scenario_volume_warning(big)
    assert warning is not None and "5.2 GiB in each target" in warning, warning
    # Writing (not storing) a lot is said too: small keys, many large sets.
    many = REFERENCE.with_overrides(keys=10, ops=1_000_000).with_value_size(1 << 20, 1 << 20)
    assert "writes about" in (scenario_volume_warning(many) or "")
