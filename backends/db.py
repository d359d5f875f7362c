"""db: Django's DatabaseCache on a SQLite file.

Django's SQLite defaults are kept (rollback journal, 5 s busy timeout is
raised to 20 s so that eight writers queue instead of failing): this is what
a project gets by pointing DatabaseCache at its default SQLite database.

That includes SQLite's deferred transactions, under which DatabaseCache loses
writes silently: a ``set`` whose transaction read first and then finds another
process writing gets "database is locked" at once (a deferred transaction
cannot wait to upgrade), DatabaseCache catches the ``DatabaseError`` and
returns as if it had stored the value. The freshness check shows those lost
writes as stale answers (docs/benchmarks.md). ``"transaction_mode":
"IMMEDIATE"`` in the database's OPTIONS avoids it; it is not set here, so the
target stays what a default project gets.
"""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "djcachebench_cache",
        "OPTIONS": env.key_limit(),
    }


def settings(env: TargetEnv) -> dict:
    return {
        "DATABASES": {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(env.workdir / "db.sqlite3"),
                "OPTIONS": {"timeout": 20},
            }
        }
    }


TARGET = Target(
    name="db",
    description="Django DatabaseCache on a SQLite file",
    caches=caches,
    settings=settings,
    setup_commands=("createcachetable",),
    note="SQLite's default deferred transactions: a set that meets another writer is lost "
    "without an error (DatabaseCache swallows the DatabaseError)",
    rank=30,
    max_keys=1_000_000,
    max_keys_reason="DatabaseCache's set is a SELECT then an INSERT per key (no bulk path): "
    "a ten-million-key pre-fill takes hours",
)
