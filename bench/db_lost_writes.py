"""Does Django's DatabaseCache on SQLite keep every write it acknowledged?

Usage: .venv/bin/python bench/db_lost_writes.py [--procs 2] [--sets 3000] [--keys 50]

Each process sets values on a few shared keys and reads each one back at
once. A read that returns neither its own value nor another process's newer
one (None, or an older value of its own: nothing deletes and the keys stay
under MAX_ENTRIES, so nothing culls) means the acknowledged set was lost.
Run once with Django's default (deferred) SQLite transactions and once with
``"transaction_mode": "IMMEDIATE"``, each on a fresh database.

Why it matters: ``DatabaseCache._base_set`` catches ``DatabaseError`` and
returns, and ``set`` returns normally, so a lost write is silent; the
harness's freshness check sees it as stale answers (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
from typing import Any


def _setup(path: str, mode: str | None) -> Any:
    import django
    from django.conf import settings

    options: dict[str, Any] = {"timeout": 20}
    if mode:
        options["transaction_mode"] = mode
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": path,
                               "OPTIONS": options}},
        CACHES={"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                            "LOCATION": "lost_writes"}},
    )
    django.setup()
    from django.core.cache import cache

    return cache


def _create(path: str) -> None:
    _setup(path, None)
    from django.core.management import call_command

    call_command("createcachetable", verbosity=0)


def _writer(path: str, mode: str | None, index: int, sets: int, keys: int, out: Any) -> None:
    cache = _setup(path, mode)
    lost = 0
    for i in range(sets):
        key, value = f"k{i % keys}", (index, i)
        cache.set(key, value)
        got = cache.get(key)
        # Another process's value may have replaced ours legitimately.
        if got is None or (got[0] == index and got[1] < i):
            lost += 1
    out.put((index, lost))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--sets", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=50)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")  # each process configures Django afresh
    for mode in (None, "IMMEDIATE"):
        with tempfile.TemporaryDirectory(prefix="djcb-lost-") as directory:
            path = os.path.join(directory, "db.sqlite3")
            creator = ctx.Process(target=_create, args=(path,))
            creator.start()
            creator.join()
            out = ctx.Queue()
            procs = [ctx.Process(target=_writer, args=(path, mode, i, args.sets, args.keys, out))
                     for i in range(args.procs)]  # fmt: skip
            for p in procs:
                p.start()
            lost = dict(out.get() for _ in procs)
            for p in procs:
                p.join()
            print(f"{mode or 'DEFERRED (default)':>20}: sets lost per process "
                  f"{[lost[i] for i in range(args.procs)]} of {args.sets:,} each")


if __name__ == "__main__":
    main()
