"""db: Django's DatabaseCache on a SQLite file.

Django's SQLite defaults are kept (rollback journal, 5 s busy timeout is
raised to 20 s so that eight writers queue instead of failing): this is what
a project gets by pointing DatabaseCache at its default SQLite database.
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
    rank=30,
)
