"""tiered: this project's TieredCache (in-process L1) over ShardedSQLiteCache."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    l2 = {
        "BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
        "LOCATION": str(env.workdir / "sqlite"),
        "OPTIONS": env.key_limit(),
    }
    return {"BACKEND": "djcachebench.backends.tiered.TieredCache", "OPTIONS": {"L2": l2}}


TARGET = Target(
    name="tiered",
    description="djcachebench TieredCache over ShardedSQLiteCache",
    caches=caches,
    modules=("djcachebench.backends.tiered", "djcachebench.backends.sqlite"),
    rank=80,
)
