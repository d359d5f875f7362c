"""``python manage.py cachestats [ALIAS ...] [--format text|json|prometheus]``.

The counters of every process of the host, summed, for each alias whose
backend keeps them (ShardedSQLiteCache, TieredCache), from any process: they
live in the cache's shared files (``djcachebench.hoststats``), each process's
counts reaching them within a flush interval. ``entries``, ``stored_bytes``
and ``disk_bytes`` are read when the command runs. Other backends are listed
as having no host-wide stats (text, JSON) or left out (Prometheus).

Exit status: 0, or 2 for an alias ``CACHES`` lacks or an unknown format.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from djcachebench.hoststats.formats import render_json, render_prometheus, render_text
from djcachebench.hoststats.report import UnknownAlias, collect

FORMATS = {"text": render_text, "json": render_json, "prometheus": render_prometheus}


class Command(BaseCommand):
    help = ("Host-wide statistics of the caches: every process's hits, misses, sets, "
            "deletes, lock give-ups, L1/L2 split and culls, summed, and entries and bytes "
            "on disk now, as text, JSON or Prometheus text.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("aliases", nargs="*", metavar="ALIAS",
                            help="CACHES aliases (default: all)")
        # Checked in handle(), not by argparse's choices: the same exit status
        # (2) and message from the command line and from call_command().
        parser.add_argument("--format", default="text",
                            help="text (default), json or prometheus")

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = options["format"]
        render = FORMATS.get(fmt)
        if render is None:
            raise CommandError(f"--format {fmt!r} is invalid; allowed: "
                               f"{', '.join(FORMATS)}.", returncode=2)
        try:
            stats = collect(options["aliases"])
        except UnknownAlias as exc:
            from django.conf import settings

            raise CommandError(f"no cache alias {exc.args[0]!r} in CACHES; allowed: "
                               f"{', '.join(settings.CACHES)}.", returncode=2) from None
        self.stdout.write(render(stats), ending="")
