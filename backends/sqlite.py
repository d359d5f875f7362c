"""sqlite: this project's ShardedSQLiteCache."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
        "LOCATION": str(env.workdir / "sqlite"),
        "OPTIONS": env.key_limit(),
    }


TARGET = Target(
    name="sqlite",
    description="djcachebench ShardedSQLiteCache",
    caches=caches,
    modules=("djcachebench.backends.sqlite",),
    rank=70,
)
