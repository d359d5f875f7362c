"""``python manage.py cachebench``: the benchmark engine against your own CACHES.

Same workload, workers, merge, report and charts as ``djcachebench bench``;
the difference is where the caches come from: each alias of the project's
``CACHES`` (all, or those given with ``--aliases``), reached in the workers
through the project's own settings module, exactly as the project's code
reaches them.

It is careful with the caches it is pointed at: it does **not** clear them,
and it only writes and deletes its own keys (``djcachebench:0`` up to the
scenario's key count, under the alias's own KEY_PREFIX and VERSION).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

#: Keys written by this command, so a shared cache's other keys are never touched.
KEY_PREFIX = "djcachebench:"


class Command(BaseCommand):
    help = (
        "Benchmark the caches of this project's CACHES setting with djcachebench's "
        "multiprocess workload (writes and deletes only keys djcachebench:*; "
        "does not clear the cache)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--aliases", help="comma-separated CACHES aliases (default: all)")
        parser.add_argument("--procs", type=int, help="worker processes (scenario's: 8)")
        parser.add_argument("--ops", type=int, help="measured ops per process (100,000)")
        parser.add_argument("--warmup", type=int, help="warm-up ops per process (1,000)")
        parser.add_argument("--keys", type=int, help="distinct keys (scenario's: 1,100)")
        parser.add_argument(
            "--value-size", metavar="N|MIN-MAX", help="value sizes, e.g. 10k or 1k-64KiB"
        )
        parser.add_argument("--scenario", default="reference", help="scenario name or TOML path")
        parser.add_argument(
            "--out", type=Path, help="output folder (default: ./bench/results/DATE-SCENARIO)"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--repeat", type=int, default=1, help="runs of every alias, interleaved (default 1)"
        )
        parser.add_argument(
            "--start-method", choices=("spawn", "forkserver", "fork"), default="spawn"
        )
        parser.add_argument("--no-plot", action="store_true", help="skip the PNG charts")

    def handle(self, *args: Any, **options: Any) -> None:
        from djcachebench.bench.cli import default_out_dir
        from djcachebench.bench.progress import Progress
        from djcachebench.bench.report import render_text, write_report
        from djcachebench.bench.results import Results
        from djcachebench.bench.runner import Job, RunOptions, run_jobs
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
            raise CommandError(str(exc)) from exc
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
            repeat=max(1, options.get("repeat") or 1),
            command=["manage.py", "cachebench", f"--aliases={','.join(aliases)}"],
        )
        out: Path = options.get("out") or default_out_dir(scenario.name)
        out.mkdir(parents=True, exist_ok=True)
        results = run_jobs(jobs, run, Progress(stream=sys.stderr))
        path = results.save(out / "results.json")
        charts: list[Path] = []
        if not options["no_plot"]:
            from djcachebench.bench.plot import plot_results

            charts = plot_results(path)
        report = write_report(path, [c.name for c in charts])
        self.stdout.write(render_text(Results.load(path)), ending="")
        self.stdout.write(f"\nresults: {path}\nreport:  {report}")


def _aliases(given: str | None) -> list[str]:
    configured = list(settings.CACHES)
    if not given:
        return configured
    aliases = [a.strip() for a in given.split(",") if a.strip()]
    unknown = [a for a in aliases if a not in settings.CACHES]
    if unknown:
        raise CommandError(f"unknown CACHES alias(es) {unknown}; configured: {configured}")
    return aliases


def _configured_settings() -> dict[str, Any]:
    return {
        "CACHES": settings.CACHES,
        "SECRET_KEY": settings.SECRET_KEY,
        "DATABASES": settings.DATABASES,
        "INSTALLED_APPS": list(settings.INSTALLED_APPS),
    }


_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)


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
        return _URL_CREDENTIALS.sub(r"\g<scheme>***@", value)
    return value
