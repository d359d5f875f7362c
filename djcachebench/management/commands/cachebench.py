"""``python manage.py cachebench``: the benchmark engine against your own CACHES.

Same workload, workers, merge, report and charts as ``djcachebench bench``;
the difference is where the caches come from: each alias of the project's
``CACHES`` (all, or those given with ``--aliases``), reached in the workers
through the project's own settings module, exactly as the project's code
reaches them.

It is careful with the caches it is pointed at: it does **not** clear them,
it only writes and deletes its own keys (``djcachebench:0`` up to the
scenario's key count, under the alias's own KEY_PREFIX and VERSION), and it
deletes those keys at the end. A cache that culls by count (``MAX_ENTRIES``:
Django's file and database caches, ShardedSQLiteCache) would cull the
project's own entries once the workload's keys fill it, so an alias whose
``MAX_ENTRIES`` is less than twice the workload's keys is refused unless
``--allow-eviction`` says that is fine (the pre-fill alone can cull most of a
project's entries).

Exit status as ``djcachebench bench``: 0 when every alias ran, 1 when one
failed (or none ran), 2 for bad input (an option's value, an unknown alias or
scenario, an --out that is not a folder, an alias it would cull), 130 on Ctrl-C
and 143 on SIGTERM (the workers stopped either way). At the end it lists every
file it wrote: results.json, each chart and report.md.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from djcachebench.bench.argtypes import (
    OutDirError,
    non_negative_int,
    positive_int,
    prepare_out_dir,
    process_count,
)

#: Keys written by this command, so a shared cache's other keys are never touched.
KEY_PREFIX = "djcachebench:"
#: Exit status for bad input, as ``djcachebench bench`` and argparse (CommandError's is 1).
BAD_INPUT = 2


def bad_input(message: str) -> CommandError:
    """The error for input the command refuses before anything runs (exit status 2)."""
    return CommandError(message, returncode=BAD_INPUT)


class Command(BaseCommand):
    help = (
        "Benchmark the caches of this project's CACHES setting with djcachebench's "
        "multiprocess workload (writes and deletes only keys djcachebench:*, and "
        "deletes them at the end; does not clear the cache; refuses an alias whose "
        "MAX_ENTRIES would cull the project's entries unless --allow-eviction)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--aliases", help="comma-separated CACHES aliases (default: all)")
        parser.add_argument("--procs", type=process_count,
                            help="worker processes (scenario's: 8)")
        parser.add_argument("--ops", type=positive_int, help="measured ops per process (100,000)")
        parser.add_argument("--warmup", type=non_negative_int,
                            help="warm-up ops per process (1,000)")
        parser.add_argument("--keys", type=positive_int, help="distinct keys (scenario's: 1,100)")
        parser.add_argument(
            "--allow-eviction", action="store_true",
            help="run against aliases whose MAX_ENTRIES is below twice the keys "
                 "(their culling may then remove the project's own entries)")
        parser.add_argument(
            "--value-size", metavar="N|MIN-MAX", help="value sizes, e.g. 10k or 1k-64KiB"
        )
        parser.add_argument("--scenario", default="reference", help="scenario name or TOML path")
        parser.add_argument(
            "--out", type=Path, help="output folder (default: ./bench/results/DATE-SCENARIO)"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--repeat", type=positive_int, default=1,
            help="runs of every alias, interleaved (default 1)"
        )
        parser.add_argument(
            "--start-method", choices=("spawn", "forkserver", "fork"), default="spawn"
        )
        parser.add_argument("--no-plot", action="store_true", help="skip the PNG charts")

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM takes Ctrl-C's path, so the workers and their sample files are
        # stopped and removed as after Ctrl-C.
        from djcachebench.bench.signals import Terminated, terminate_as_interrupt

        previous = signal.signal(signal.SIGTERM, terminate_as_interrupt)
        try:
            failed = self._handle(**options)
        except Terminated:
            # 143, not Ctrl-C's 130: a supervisor knows its own signal ended the run.
            raise CommandError("terminated; workers stopped", returncode=143) from None
        except KeyboardInterrupt:
            raise CommandError("interrupted; workers stopped", returncode=130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
        if failed:
            raise CommandError(f"failed: {', '.join(failed)} (see the report)", returncode=1)

    def _handle(self, **options: Any) -> list[str]:
        """Run the benchmark; the aliases that failed (or ``["every alias"]``)."""
        from djcachebench.bench.cli import default_out_dir, failed_targets
        from djcachebench.bench.progress import Progress
        from djcachebench.bench.report import render_text, write_report
        from djcachebench.bench.results import Results
        from djcachebench.bench.runner import Job, RunOptions, run_jobs
        from djcachebench.bench.targets import is_per_process
        from djcachebench.bench.values import SizeError, parse_size_range
        from djcachebench.bench.workload import ScenarioError, load_scenario

        aliases = _aliases(options.get("aliases"))
        try:
            scenario = load_scenario(options["scenario"]).with_overrides(
                procs=options.get("procs"),
                ops=options.get("ops"),
                warmup=options.get("warmup"),
                keys=options.get("keys"),
                key_prefix=KEY_PREFIX,
            )
            if options.get("value_size"):
                scenario = scenario.with_value_size(*parse_size_range(options["value_size"]))
        except (ScenarioError, SizeError) as exc:
            raise bad_input(str(exc)) from exc
        if not options["allow_eviction"]:
            _refuse_eviction(aliases, scenario.keys)
        module = getattr(settings, "SETTINGS_MODULE", None)
        jobs = []
        for alias in aliases:
            job = Job(
                name=alias,
                alias=alias,
                settings_module=module,
                # Without a settings module (settings.configure()), pass what the
                # workers need to reach the same caches.
                settings={} if module else _configured_settings(),
                clear=False,
                delete_keys=True,  # its own keys only (KEY_PREFIX): gets are still checked
                # A LocMemCache alias is private to each worker: only its own writes
                # are held against it (freshness.Scope), as for the locmem target.
                per_process=is_per_process(settings.CACHES[alias]),
            )
            described = {
                "description": f"CACHES[{alias!r}] of {module or 'settings.configure()'}",
                "note": "",
                "settings": {"CACHES": {alias: redact(settings.CACHES[alias])}},
            }
            jobs.append((job, described))
        run = RunOptions(
            scenario=scenario,
            seed=options["seed"],
            start_method=options["start_method"],
            repeat=options["repeat"],
            command=["manage.py", "cachebench", f"--aliases={','.join(aliases)}"],
        )
        try:
            out = prepare_out_dir(options.get("out") or default_out_dir(scenario.name))
        except OutDirError as exc:
            raise bad_input(str(exc)) from None
        try:
            results = run_jobs(jobs, run, Progress(stream=sys.stderr))
        finally:
            _delete_own_keys(aliases, scenario)
        path = results.save(out / "results.json")
        charts: list[Path] = []
        if not options["no_plot"]:
            from djcachebench.bench.plot import missing_matplotlib, plot_results

            missing = missing_matplotlib()
            if missing:
                self.stderr.write(f"charts skipped: {missing}")
            else:
                charts = plot_results(path)
        report = write_report(path, [c.name for c in charts])
        saved = Results.load(path)
        self.stdout.write(render_text(saved), ending="")
        # Every file written, as ``djcachebench bench`` lists them.
        self.stdout.write(f"\nresults: {path}")
        for chart in charts:
            self.stdout.write(f"chart:   {chart}")
        self.stdout.write(f"report:  {report}")
        return failed_targets(saved) or ([] if saved.backends else ["every alias"])


def _aliases(given: str | None) -> list[str]:
    configured = list(settings.CACHES)
    if given is None:
        return configured
    aliases = [a.strip() for a in given.split(",") if a.strip()]
    if not aliases:
        raise bad_input(f"--aliases names no alias; configured: {configured}")
    unknown = [a for a in aliases if a not in settings.CACHES]
    if unknown:
        raise bad_input(f"unknown CACHES alias(es) {unknown}; configured: {configured}")
    return aliases


def _configured_settings() -> dict[str, Any]:
    return {
        "CACHES": settings.CACHES,
        "SECRET_KEY": settings.SECRET_KEY,
        "DATABASES": settings.DATABASES,
        "INSTALLED_APPS": list(settings.INSTALLED_APPS),
    }


def _refuse_eviction(aliases: list[str], keys: int) -> None:
    """CommandError for an alias whose count limit the workload's keys could fill:
    its culling would then remove the project's own entries too. LocMemCache is
    per process (the workers' copies are their own) and DummyCache keeps nothing."""
    from django.core.cache import caches
    from django.core.cache.backends.dummy import DummyCache
    from django.core.cache.backends.locmem import LocMemCache

    for alias in aliases:
        try:
            cache = caches[alias]
        except Exception:  # reported as that alias's failure when it runs
            continue
        limit = getattr(cache, "_max_entries", None)
        if isinstance(cache, LocMemCache | DummyCache) or type(limit) is not int:
            continue
        if limit < 2 * keys:
            raise bad_input(
                f"CACHES[{alias!r}] has MAX_ENTRIES {limit:,}: the workload's {keys:,} keys "
                f"could make it cull this project's own entries. Use --keys {limit // 2} or "
                f"fewer, or --allow-eviction if that is fine for this cache.")


def _delete_own_keys(aliases: list[str], scenario: Any) -> None:
    """Delete the workload's keys from every alias (they are ours: ``KEY_PREFIX``)."""
    from django.core.cache import caches

    from djcachebench.bench.workload import key_batches

    for alias in aliases:
        try:
            cache = caches[alias]
            for keys in key_batches(scenario):
                cache.delete_many(keys)
        except Exception:  # the results matter more; leftovers are ours, by name
            pass


_SECRET_NAME = re.compile(r"pass|secret|token|auth|key", re.IGNORECASE)


def redact(value: Any) -> Any:
    """A copy of a CACHES entry safe to write into results: no passwords.

    Credentials in URLs (``redis://:secret@host``) and values of keys that
    name a password or token are replaced by ``***``.
    """
    if isinstance(value, dict):
        return {
            k: "***"
            if isinstance(k, str) and re.search(r"pass|secret|token", k, re.IGNORECASE)
            else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _redact_url(value) if "://" in value else value
    return value


def _redact_url(text: str) -> str:
    """A URL without credentials: its whole user part (up to the last ``@`` of the
    host part: a password may hold an ``@``) and the values of query parameters
    that name a password, secret, token or key (redis-py reads ``?password=``).
    Without it, both would leak into results.json."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if _SECRET_NAME.search(k) else v) for k, v in pairs],
                          safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
