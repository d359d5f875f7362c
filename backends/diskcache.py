"""diskcache: python-diskcache's DjangoCache with its defaults (8 SQLite shards)."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "diskcache.DjangoCache",
        "LOCATION": str(env.workdir / "diskcache"),
    }


TARGET = Target(
    name="diskcache",
    description="diskcache.DjangoCache (defaults)",
    caches=caches,
    modules=("diskcache",),
    note="no key-count limit (bounded by size_limit, 1 GiB by default)",
    rank=60,
)
